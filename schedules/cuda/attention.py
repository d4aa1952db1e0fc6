"""Fused multi-head attention for CUDA GPUs: the CPU kernel's algorithm (``schedules/cpu/
attention.py``), one query row per thread.

A thread block takes ``TQ`` query rows of one (batch, head); each thread keeps its query row and
its ``D`` output accumulators in registers and walks the keys once with the online softmax
(running maximum and sum, the accumulators rescaled when the maximum grows). The threads of a
block read the same key and value rows at the same time, which the L1 cache serves once. Scores
and probabilities never reach memory, and Q, K, V are read from the packed QKV tensor at their
channel offsets, as on CPUs.

Written for short sequences (BERT's 128): one pass per thread over all keys, no shared-memory
tiling and no tensor cores; the dot product is split over four partial sums so that one FMA chain
does not serialize it.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from tvmfuse.passes.fuse_attention import AttentionShape
from tvmfuse.schedules.cpu._tir import lanes_for  # the largest power of two dividing a size

#: The name a kernel of this file reports as its implementation.
NAME = "cuda.attention"


def attention_kernel(shape: AttentionShape) -> tirx.PrimFunc:
    """The scheduled CUDA kernel for ``shape``."""
    B, S, H, D = shape.batch, shape.seq, shape.heads, shape.head_dim  # noqa: N806
    (CQ, QO), (CK, KO), (CV, VO) = shape.q, shape.k, shape.v  # noqa: N806
    MB, MH, MQ, MK = shape.mask  # noqa: N806
    fb, fh, fq, fk = (int(n != 1) for n in (MB, MH, MQ, MK))
    TQ = lanes_for(S, 16)  # noqa: N806 - query rows (threads) per block
    NQ = S // TQ  # noqa: N806
    P = 4 if D % 4 == 0 else 1  # noqa: N806 - partial sums of the dot product
    scale = float(shape.scale)
    dtype = shape.dtype

    @T.prim_func(private=True)
    def attention(q: T.Buffer((B, S, CQ), dtype), k: T.Buffer((B, S, CK), dtype),
                  v: T.Buffer((B, S, CV), dtype), mask: T.Buffer((MB, MH, MQ, MK), dtype),
                  out: T.Buffer((B, S, H * D), dtype)):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "tvmfuse.schedule": NAME})
        for block in T.thread_binding(B * H * NQ, thread="blockIdx.x"):
            for row in T.thread_binding(TQ, thread="threadIdx.x"):
                b = block // (H * NQ)
                h = block // NQ % H
                i = block % NQ * TQ + row
                q_row = T.decl_buffer((D,), "float32", scope="local")
                acc = T.decl_buffer((D,), "float32", scope="local")
                part = T.decl_buffer((P,), "float32", scope="local")
                # state: 0 running max, 1 running sum, 2 score, 3 new max, 4 rescale, 5 prob
                st = T.decl_buffer((6,), "float32", scope="local")
                for d in T.unroll(D):
                    q_row[d] = T.Cast("float32", q[b, i, QO + h * D + d])
                    acc[d] = T.float32(0)
                st[0] = T.min_value("float32")
                st[1] = T.float32(0)
                for j in range(S):
                    for p in T.unroll(P):
                        part[p] = T.float32(0)
                    for dd in T.unroll(D // P):
                        for p in T.unroll(P):
                            part[p] = part[p] + q_row[dd * P + p] * T.Cast(
                                "float32", k[b, j, KO + h * D + dd * P + p])
                    st[2] = T.float32(0)
                    for p in T.unroll(P):
                        st[2] = st[2] + part[p]
                    st[2] = st[2] * T.float32(scale) + T.Cast(
                        "float32", mask[b * fb, h * fh, i * fq, j * fk])
                    st[3] = T.max(st[0], st[2])
                    st[4] = T.exp(st[0] - st[3])
                    st[5] = T.exp(st[2] - st[3])
                    st[1] = st[1] * st[4] + st[5]
                    st[0] = st[3]
                    for d in T.unroll(D):
                        acc[d] = acc[d] * st[4] + st[5] * T.Cast("float32", v[b, j, VO + h * D + d])
                for d in T.unroll(D):
                    out[b, i, h * D + d] = T.Cast(dtype, acc[d] / st[1])

    return attention
