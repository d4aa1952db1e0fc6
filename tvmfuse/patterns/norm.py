"""Normalization fusion: the residual add before a LayerNorm, in the LayerNorm's kernel, and
LayerNorm in the epilogue of the GEMM whose output it normalizes.

Stock FuseOps tags ``layer_norm`` so that an elementwise producer cannot join it, which leaves
every residual add of a transformer as a kernel of its own (25 in BERT-base). A post-LN
transformer (BERT) normalizes ``x + (h @ W + b)`` twice per layer; the normalized rows feed both
the next GEMM and a later residual add, so folding the LayerNorm into the *next* GEMM's prologue
would compute it twice or write it anyway. Its own GEMM's epilogue computes it once: the kernel
finishes the GEMM's rows, then normalizes them while they are still in cache.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard
from tvm.relax.transform import FusionPattern

from .epilogue import _at_most


def add_layer_norm_patterns(max_group_size: int) -> list[FusionPattern]:
    """``layer_norm(a + b)``, and in low-precision builds its casts: ToMixedPrecision keeps
    LayerNorm in float32, so a float16 GEMM's output is widened before the add and the
    normalized rows narrowed for the next GEMM (each cast a kernel of its own, 24 of 4 MB each in
    BERT-base); here the widenings are read in the kernel and the narrowed rows are its output.
    The narrowing joins only where nothing else reads the float32 rows: StoreNarrowed makes the
    residual read the narrowed copy (fusion would otherwise hide a value the graph still
    needs)."""
    residual = is_op("relax.add")(_operand(), _operand())
    norm = is_op("relax.nn.layer_norm")(residual, wildcard(), wildcard())
    narrowed = is_op("relax.astype")(norm)
    return [FusionPattern(f"tvmfuse.add_layer_norm.{name}", pattern, {},
                          _at_most(max_group_size))
            for name, pattern in (("narrowed", narrowed), ("affine", norm))]


def layer_norm_epilogue_patterns(max_group_size: int,
                                 takes: Callable[[relax.Call], bool] | None = None,
                                 ) -> list[FusionPattern]:
    """``layer_norm(matmul(x, W) [+ b] + residual)``, in low-precision builds with the casts
    :func:`add_layer_norm_patterns` takes (the GEMM's output and the residual widened, the
    normalized rows narrowed: ``*_narrowed``); with ``takes``, only where it accepts the
    group's matmul call (a target whose kernel for the group takes some shapes only)."""
    limit = _at_most(max_group_size)

    def check(context) -> bool:
        if not limit(context):
            return False
        matmul = next((e for e in context.matched_bindings.values() if isinstance(e, relax.Call)
                       and e.op.same_as(tvm.ir.Op.get("relax.matmul"))), None)
        return takes is None or matmul is not None and takes(matmul)

    patterns = []
    for bias in (True, False):
        y = is_op("relax.matmul")(wildcard(), wildcard())
        if bias:
            y = is_op("relax.add")(y, is_const())
        summed = is_op("relax.add")(is_op("relax.astype")(y) | y, _operand())
        norm = is_op("relax.nn.layer_norm")(summed, wildcard(), wildcard())
        name = "bias_add" if bias else "add"
        patterns += [
            FusionPattern(f"tvmfuse.layer_norm_epilogue.{name}_narrowed",
                          is_op("relax.astype")(norm), {}, check),
            FusionPattern(f"tvmfuse.layer_norm_epilogue.{name}", norm, {}, check)]
    return patterns


def _operand():
    """A value, or a value widened (as ToMixedPrecision leaves a LayerNorm's inputs)."""
    return is_op("relax.astype")(wildcard()) | wildcard()
