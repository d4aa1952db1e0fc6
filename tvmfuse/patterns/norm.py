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
    """``layer_norm(a + b)``, and in low-precision builds its casts: ToMixedPrecision keeps
    LayerNorm in float32, so a float16 GEMM's output is widened before the add and the
    normalized rows narrowed for the next GEMM (each cast a kernel of its own, 24 of 4 MB each in
    BERT-base); here the widenings are read in the kernel and the narrowed rows are its output.
    The narrowing joins only where nothing else reads the float32 rows: StoreNarrowed makes the
    residual read the narrowed copy (fusion would otherwise hide a value the graph still
    needs)."""
    def operand():
        return is_op("relax.astype")(wildcard()) | wildcard()

    residual = is_op("relax.add")(operand(), operand())
    norm = is_op("relax.nn.layer_norm")(residual, wildcard(), wildcard())
    narrowed = is_op("relax.astype")(norm)
    return [FusionPattern(f"tvmfuse.add_layer_norm.{name}", pattern, {},
                          _at_most(max_group_size))
            for name, pattern in (("narrowed", narrowed), ("affine", norm))]


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
