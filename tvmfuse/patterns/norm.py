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

from tvm.relax.dpl import is_const, is_op, wildcard
from tvm.relax.transform import FusionPattern

from .epilogue import _at_most


def add_layer_norm_patterns(max_group_size: int) -> list[FusionPattern]:
    residual = is_op("relax.add")(wildcard(), wildcard())
    norm = is_op("relax.nn.layer_norm")(residual, wildcard(), wildcard())
    return [FusionPattern("tvmfuse.add_layer_norm.affine", norm, {}, _at_most(max_group_size))]


def layer_norm_epilogue_patterns(max_group_size: int) -> list[FusionPattern]:
    """``layer_norm(matmul(x, W) [+ b] + residual)``."""
    patterns = []
    for bias in (True, False):
        y = is_op("relax.matmul")(wildcard(), wildcard())
        if bias:
            y = is_op("relax.add")(y, is_const())
        summed = is_op("relax.add")(y, wildcard())  # either operand order (dpl)
        norm = is_op("relax.nn.layer_norm")(summed, wildcard(), wildcard())
        name = "bias_add" if bias else "add"
        patterns.append(FusionPattern(f"tvmfuse.layer_norm_epilogue.{name}", norm, {},
                                      _at_most(max_group_size)))
    return patterns
