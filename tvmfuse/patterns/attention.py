"""Attention-score fusion: scale, additive mask and softmax in one kernel.

BERT's scores go ``reshape -> multiply(scale) -> add(mask) -> softmax -> broadcast_to ->
reshape``; stock FuseOps cuts this before the softmax (a reduction cannot take an elementwise
producer), so the scaled and masked scores make a round trip through memory per layer.
"""

from __future__ import annotations

from tvm.relax.dpl import is_const, is_op, wildcard
from tvm.relax.transform import FusionPattern

from .epilogue import _at_most


def scale_mask_softmax_patterns(max_group_size: int) -> list[FusionPattern]:
    """In fp16 builds, where ToMixedPrecision keeps softmax in float32, with the widening of the
    scaled scores and the narrowing of the probabilities (each a kernel of its own otherwise: at
    BERT-base's batch 32, 25 MB of float32 scores a layer written and read back twice)."""
    scores = wildcard()
    shaped = is_op("relax.reshape")(scores, wildcard()) | scores
    scaled = is_op("relax.multiply")(shaped, is_const()) | is_op("relax.divide")(shaped, is_const())
    widened = is_op("relax.astype")(scaled) | scaled
    probs = is_op("relax.nn.softmax")(is_op("relax.add")(widened, wildcard()))
    reshaped = is_op("relax.reshape")(is_op("relax.broadcast_to")(probs, wildcard()), wildcard())
    check = _at_most(max_group_size)
    return [
        FusionPattern("tvmfuse.scale_mask_softmax.reshaped_narrowed",
                      is_op("relax.astype")(reshaped), {}, check),
        FusionPattern("tvmfuse.scale_mask_softmax.reshaped", reshaped, {}, check),
        FusionPattern("tvmfuse.scale_mask_softmax.narrowed", is_op("relax.astype")(probs), {},
                      check),
        FusionPattern("tvmfuse.scale_mask_softmax.plain", probs, {}, check),
    ]
