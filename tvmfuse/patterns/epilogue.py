"""Epilogue fusion: an anchor op (conv2d, matmul) with the elementwise ops that follow it.

Each pattern is ``anchor [+ bias] [+ residual] [-> activation]``, where the bias is a constant
(as BatchNorm folding and linear layers leave it) and the residual any tensor; the variants are named
``tvmfuse.<family>.<parts>`` (e.g. ``tvmfuse.conv_epilogue.bias_add_relu``) and longer variants
come first, so the largest epilogue wins. Activations are matched in the decomposed form
torch.export gives them (SiLU is ``x * sigmoid(x)``, hardswish ``x * clip(x + 3, 0, 6) / 6``).
"""

from __future__ import annotations

from collections.abc import Callable

from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard
from tvm.relax.transform import FusionPattern


def _clip(y: DFPattern) -> DFPattern:
    return is_op("relax.clip")(y, wildcard(), wildcard())


def _minmax(y: DFPattern) -> DFPattern:
    """A clip as DecomposeClip leaves it (on CPUs, before the NHWC layout)."""
    return is_op("relax.minimum")(is_op("relax.maximum")(y, is_const()), is_const())


def _hardswish(clip: Callable[[DFPattern], DFPattern]) -> Callable[[DFPattern], DFPattern]:
    def pattern(y: DFPattern) -> DFPattern:
        gate = clip(clip(is_op("relax.add")(y, is_const())))
        return is_op("relax.divide")(is_op("relax.multiply")(y, gate), is_const())

    return pattern


#: Activation name -> pattern of the activation applied to ``y`` (ReLU6 is a clip).
ACTIVATIONS: dict[str, Callable[[DFPattern], DFPattern]] = {
    "hardswish": _hardswish(_clip),
    "hardswish_minmax": _hardswish(_minmax),
    "minmax": _minmax,
    "silu": lambda y: is_op("relax.multiply")(y, is_op("relax.sigmoid")(y)),
    "relu": lambda y: is_op("relax.nn.relu")(y),
    "clip": _clip,
    "gelu": lambda y: is_op("relax.nn.gelu")(y),
    "gelu_tanh": lambda y: is_op("relax.nn.gelu_tanh")(y),
    "sigmoid": lambda y: is_op("relax.sigmoid")(y),
    "tanh": lambda y: is_op("relax.tanh")(y),  # BERT's pooler
}

#: Anchor ops of each epilogue family.
ANCHORS = {"conv_epilogue": "relax.nn.conv2d", "matmul_epilogue": "relax.matmul"}


def epilogue_patterns(family: str, max_group_size: int) -> list[FusionPattern]:
    """Every ``anchor [+ bias] [+ residual] [-> activation]`` variant of ``family``, longest
    first; a match holding more than ``max_group_size`` ops is rejected."""
    variants = []
    for bias in (True, False):  # bias first: where both fit an add, it is the constant bias
        for residual in (True, False):
            for act in (*ACTIVATIONS, None):
                if not (bias or residual or act):
                    continue  # the anchor alone is no fusion
                y = is_op(ANCHORS[family])(wildcard(), wildcard())
                parts = []
                if bias:  # a folded bias is a constant; a residual is computed
                    y, parts = is_op("relax.add")(y, is_const()), [*parts, "bias"]
                if residual:
                    y, parts = is_op("relax.add")(y, wildcard()), [*parts, "add"]
                if act:
                    y, parts = ACTIVATIONS[act](y), [*parts, act]
                variants.append((f"tvmfuse.{family}.{'_'.join(parts)}", y))
    variants.sort(key=lambda v: -_size(v[1]))
    return [FusionPattern(name, pattern, {}, _at_most(max_group_size))
            for name, pattern in variants]


def isolate_patterns(family: str) -> list[FusionPattern]:
    """With ``family`` switched off, its anchors become kernels of their own: nothing fuses in."""
    anchor = is_op(ANCHORS[family])(wildcard(), wildcard())
    return [FusionPattern(f"tvmfuse.{family}.off", anchor)]


def _size(pattern: DFPattern) -> int:
    """Ops in a pattern (its call nodes, shared sub-patterns counted once)."""
    seen, stack = set(), [pattern]
    while stack:
        node = stack.pop()
        if node in seen or not hasattr(node, "args"):  # ObjectRefs hash by identity
            continue
        seen.add(node)
        stack.extend(node.args)
    return len(seen)


def _at_most(limit: int):
    """Accept a match of at most ``limit`` ops whose intermediates nothing outside it uses: a
    value the group hides (a block output that is also a later residual) must stay a kernel
    output."""
    def check(context) -> bool:
        return (len(context.matched_bindings) <= limit
                and not has_leaking_intermediate_variables(context))

    return check
