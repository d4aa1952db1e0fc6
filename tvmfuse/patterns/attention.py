"""Attention fusion where the attention is not one kernel: scale, additive mask and softmax in
one kernel; the batched matmuls with the head split they read Q and V through.

BERT's scores go ``reshape -> multiply(scale) -> add(mask) -> softmax -> broadcast_to ->
reshape``; stock FuseOps cuts this before the softmax (a reduction cannot take an elementwise
producer), so the scaled and masked scores make a round trip through memory per layer.

The batched matmuls ``Q K^T`` and ``P V`` read Q, K and V through the head split (``strided_slice``
of the packed QKV, ``reshape`` to heads, ``permute_dims``, ``broadcast_to``, ``reshape``), which
FuseOps makes a copy kernel each. In the matmul's kernel they are index arithmetic: the
tensor-core GEMM reads Q and V from the packed QKV tensor (contiguous along the head dimension,
16 bytes a copy). K^T (a transpose) and the head merge after ``P V`` stay copies.
"""

from __future__ import annotations

from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard
from tvm.relax.transform import FusionPattern

from ..passes._rewrite import calls_op
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


def _head_views(x: DFPattern) -> DFPattern:
    """A batched matmul operand read through a head split: ``[strided_slice ->] reshape ->
    permute_dims [-> broadcast_to] [-> reshape]``."""
    sliced = is_op("relax.strided_slice")(x, varg_default_wildcard=True) | x
    split = is_op("relax.permute_dims")(is_op("relax.reshape")(sliced, wildcard()))
    spread = is_op("relax.broadcast_to")(split, wildcard()) | split
    return is_op("relax.reshape")(spread, wildcard()) | spread


def head_matmul_patterns(max_group_size: int) -> list[FusionPattern]:
    """``matmul`` with at least one operand read through a head split (:func:`_head_views`).
    The head merge after ``P V`` stays a copy (its reshapes' divisions cannot be inlined
    backwards into the GEMM's store: dlight's ``auto_inline_consumer_chain`` refuses them).
    Permutes that move the last axis (K^T's ``[0, 2, 3, 1]``) stay copies: the GEMM copies
    an operand along the axis contiguous in its (reindexed) buffer, which a transpose read in
    place would make a strided gather."""
    at_most = _at_most(max_group_size)

    def check(context) -> bool:
        for binding in context.matched_bindings.values():
            if calls_op(binding, "relax.permute_dims"):
                axes = [int(a) for a in binding.attrs.axes]
                if axes[-1] != len(axes) - 1:
                    return False
        return at_most(context)

    patterns = []
    for name, (a, b) in (("both", (_head_views(wildcard()), _head_views(wildcard()))),
                         ("lhs", (_head_views(wildcard()), wildcard())),
                         ("rhs", (wildcard(), _head_views(wildcard())))):
        patterns.append(FusionPattern(f"tvmfuse.head_matmul.{name}",
                                      is_op("relax.matmul")(a, b), {}, check))
    return patterns
