"""Shapes a pass hands to the schedules that write its kernels: the pass finds the op in Relax and
describes it here, the target's schedule builds the kernel from the description. Both import from
here, so that schedules/ needs nothing from tvmfuse.passes."""

from __future__ import annotations

from dataclasses import dataclass

import tvm


@dataclass(frozen=True)
class AttentionShape:
    """One attention call: ``batch`` x ``heads`` heads of ``head_dim``, ``seq`` queries and
    ``kv_seq`` keys (as many unless it is cross-attention or a decoding step over a cache).

    ``batch``, ``seq`` and ``kv_seq`` are symbolic (a ``PrimExpr``) where the model keeps them
    so (``--dynamic batch,seq``). ``q``, ``k``, ``v`` are ``(channels, offset)``: the width of the
    ``[batch, seq, channels]`` tensor each is read from and the channel where head 0 starts.
    ``mask`` is the shape of the additive mask, broadcast to ``[batch, heads, seq, seq]``
    (dimensions of 1 are broadcast)."""

    batch: int | tvm.tirx.PrimExpr
    seq: int | tvm.tirx.PrimExpr
    heads: int
    head_dim: int
    q: tuple[int, int]
    k: tuple[int, int]
    v: tuple[int, int]
    mask: tuple
    scale: float
    dtype: str = "float32"
    kv_seq: int | tvm.tirx.PrimExpr | None = None

    def __post_init__(self):
        if self.kv_seq is None:
            object.__setattr__(self, "kv_seq", self.seq)
