"""Normalization fusion: the residual add before a LayerNorm, in the LayerNorm's kernel.

Stock FuseOps tags ``layer_norm`` so that an elementwise producer cannot join it, which leaves
every residual add of a transformer as a kernel of its own (25 in BERT-base).
"""

from __future__ import annotations

from tvm.relax.dpl import is_op, wildcard
from tvm.relax.transform import FusionPattern

from .epilogue import _at_most


def add_layer_norm_patterns(max_group_size: int) -> list[FusionPattern]:
    residual = is_op("relax.add")(wildcard(), wildcard())
    norm = is_op("relax.nn.layer_norm")(residual, wildcard(), wildcard())
    return [FusionPattern("tvmfuse.add_layer_norm.affine", norm, {}, _at_most(max_group_size))]
