"""Fused multi-head attention for CPUs: ``softmax(Q K^T * scale + mask) V`` in one kernel, with an
online (flash-style) softmax, reading Q, K and V where the projection GEMM wrote them.

This is a kernel, not a schedule rule: attention is a chain of two batched GEMMs around a row
softmax, which no rule over a FuseTIR kernel can turn into one loop nest, so the kernel is written
scheduled, in TensorIR, and :class:`tvmfuse.passes.FuseAttention` calls it in place of the chain.

Per task (batch, head, tile of ``TQ`` query rows), on the thread pool:

1. a tile of ``TK`` keys is transposed into ``kt[D, TK]`` (once per tile, reused by the ``TQ``
   rows), so the scores ``s[i, :TK] += q[i, d] * kt[d, :TK]`` are vector FMAs with ``q``
   broadcast, accumulated in a ``TK``-wide register tile;
2. scale and mask are applied, the row's running maximum and sum rescaled (``exp(m_old - m_new)``,
   the online softmax), and ``acc[i, :D] += p[i, j] * v[j, :D]`` accumulated in registers;
3. after the last key tile each row is divided by its sum and written to ``out[b, s, h * D + d]``:
   the heads merged, as the output projection reads them.

Scores and probabilities never leave the task's stack: per layer of BERT-base that is 12 x 128 x
128 floats (768 KiB) not written and read back twice, and the head split and merge are address
arithmetic instead of copies. ``q``, ``k`` and ``v`` are ``[B, S, C]`` tensors read at channel
offsets (``qo + h * D + d``), so one packed QKV GEMM output serves all three. Arithmetic is in
float32 whatever the storage dtype.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from tvmfuse.passes.fuse_attention import AttentionShape

#: The name a kernel of this file reports as its implementation.
NAME = "cpu.attention"


def fast_exp(x):
    """``exp(x)`` for float32 ``x`` as TIR arithmetic that vectorizes (TVM's ``topi.fast_exp``:
    ``2^n`` from the exponent bits times a degree-7 polynomial, relative error about 1e-7); LLVM
    turns ``T.exp`` on a vector into one ``expf`` call per lane."""
    x = T.max(T.min(x, T.float32(88.3762626647950)), T.float32(-88.3762626647949))
    n = T.floor(x * T.float32(1.44269504088896341) + T.float32(0.5))
    f = x - n * T.float32(0.6931471805599453)
    poly = T.float32(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
              5.0000001201e-1):
        poly = poly * f + T.float32(c)
    y = poly * f * f + f + T.float32(1)
    two_n = T.reinterpret("float32", T.shift_left(T.Cast("int32", n + T.float32(127)), 23))
    return two_n * y


def _tile(extent: int, preferred: int) -> int:
    """The largest power of two up to ``preferred`` that divides ``extent``."""
    tile = preferred
    while tile > 1 and extent % tile:
        tile //= 2
    return tile


def attention_kernel(shape: AttentionShape, lanes: int = 16) -> tirx.PrimFunc:
    """The scheduled kernel for ``shape``; ``lanes`` is the fp32 vector width (16 on AVX-512)."""
    B, S, H, D = shape.batch, shape.seq, shape.heads, shape.head_dim  # noqa: N806
    (CQ, QO), (CK, KO), (CV, VO) = shape.q, shape.k, shape.v  # noqa: N806
    MB, MH, MQ, MK = shape.mask  # noqa: N806
    # A mask dimension of 1 is broadcast: its index is multiplied by 0.
    fb, fh, fq, fk = (int(n != 1) for n in (MB, MH, MQ, MK))
    TQ = _tile(S, 32)  # noqa: N806 - query rows per task
    TK = _tile(S, 2 * lanes)  # noqa: N806 - keys per tile: two vectors of scores
    NQ, NK = S // TQ, S // TK  # noqa: N806
    scale = float(shape.scale)
    dtype = shape.dtype

    @T.prim_func(private=True)
    def attention(q: T.Buffer((B, S, CQ), dtype), k: T.Buffer((B, S, CK), dtype),
                  v: T.Buffer((B, S, CV), dtype), mask: T.Buffer((MB, MH, MQ, MK), dtype),
                  out: T.Buffer((B, S, H * D), dtype)):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "tvmfuse.schedule": NAME})
        for task in T.parallel(B * H * NQ):
            if True:
                b = task // (H * NQ)
                h = task // NQ % H
                q0 = task % NQ * TQ
                kt = T.decl_buffer((D, TK), "float32")
                p = T.decl_buffer((TQ, TK), "float32")
                acc = T.decl_buffer((TQ, D), "float32")
                row_max = T.decl_buffer((TQ,), "float32")
                row_sum = T.decl_buffer((TQ,), "float32")
                for i in range(TQ):
                    row_max[i] = T.min_value("float32")  # a masked score is no lower
                    row_sum[i] = T.float32(0)
                    for d in T.vectorized(D):
                        acc[i, d] = T.float32(0)
                for kb in range(NK):
                    for j, d in T.grid(TK, D):
                        kt[d, j] = T.Cast("float32", k[b, kb * TK + j, KO + h * D + d])
                    for i in range(TQ):
                        if True:
                            s = T.decl_buffer((TK,), "float32", scope="local")
                            o = T.decl_buffer((D,), "float32", scope="local")
                            m = T.decl_buffer((2,), "float32", scope="local")
                            for j in T.vectorized(TK):
                                s[j] = T.float32(0)
                            for d in range(D):
                                for j in T.vectorized(TK):
                                    s[j] = s[j] + T.Cast("float32", q[b, q0 + i, QO + h * D + d]) * kt[d, j]
                            for j in T.vectorized(TK):
                                s[j] = s[j] * T.float32(scale) + T.Cast("float32", mask[
                                    b * fb, h * fh, (q0 + i) * fq, (kb * TK + j) * fk])
                            # the online softmax: a new maximum rescales what was summed so far
                            m[0] = row_max[i]
                            for j in range(TK):
                                m[0] = T.max(m[0], s[j])
                            m[1] = fast_exp(row_max[i] - m[0])
                            row_max[i] = m[0]
                            for j in T.vectorized(TK):
                                p[i, j] = fast_exp(s[j] - m[0])
                            row_sum[i] = row_sum[i] * m[1]
                            for j in range(TK):
                                row_sum[i] = row_sum[i] + p[i, j]
                            for d in T.vectorized(D):
                                o[d] = acc[i, d] * m[1]
                            for j in range(TK):
                                for d in T.vectorized(D):
                                    o[d] = o[d] + p[i, j] * T.Cast("float32", v[b, kb * TK + j, VO + h * D + d])
                            for d in T.vectorized(D):
                                acc[i, d] = o[d]
                for i in range(TQ):
                    for d in T.vectorized(D):
                        out[b, q0 + i, h * D + d] = T.Cast(dtype, acc[i, d] / row_sum[i])

    return attention
