"""Declarative fusion rules (relax.dpl), named ``tvmfuse.<family>.<variant>``."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from tvm import relax
from tvm.relax.transform import FusionPattern

from ..rules import Rule
from .attention import head_matmul_patterns, scale_mask_softmax_patterns
from .epilogue import ANCHORS, epilogue_patterns, isolate_patterns
from .norm import add_layer_norm_patterns, layer_norm_epilogue_patterns


def fusion_patterns(rules: dict[str, Rule],
                    row_norm_takes: Callable[[relax.Call], bool] | None = None,
                    quantized: bool = False) -> list[FusionPattern]:
    """The patterns of every enabled pattern rule, highest priority first; anchors of a disabled
    epilogue family are isolated so that the leftover FuseOps cannot fuse into them either.
    ``row_norm_takes`` (a target's: see ``Strategy.row_norm_takes``) limits the
    ``layer_norm_epilogue`` groups to the matmuls it accepts. ``quantized`` (an int8 build)
    adds the epilogues that end in the quantization of the next GEMM's or conv's input."""
    families = []
    for family in ANCHORS:
        rule = rules[family]
        patterns = (epilogue_patterns(family, rule.max_group_size, quantized) if rule.enabled
                    else isolate_patterns(family))
        families.append((rule.priority, patterns))
    for name, make in (("layer_norm_epilogue", partial(layer_norm_epilogue_patterns,
                                                        takes=row_norm_takes)),
                       ("add_layer_norm", add_layer_norm_patterns),
                       ("scale_mask_softmax", scale_mask_softmax_patterns),
                       ("head_matmul", head_matmul_patterns)):
        rule = rules[name]
        if rule.enabled:
            families.append((rule.priority, make(rule.max_group_size)))
    families.sort(key=lambda f: -f[0])
    return [p for _, patterns in families for p in patterns]
