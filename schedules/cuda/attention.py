"""Fused multi-head attention for CUDA GPUs: the CPU kernel's online softmax
(``schedules/cpu/attention.py``), one warp per query row.

A thread block of ``ROWS`` warps takes ``ROWS`` query rows of one (batch, head) and walks the keys
in tiles of 32, the warp's width:

1. the block loads the tile's K and V rows into shared memory (K rows padded by one element so
   that the 32 lanes reading 32 different rows at one offset hit 32 different banks);
2. lane ``l`` of each warp scores key ``l`` of the tile against the warp's query row (held in
   shared memory, read by all lanes at once: a broadcast);
3. each lane reads the warp's 32 scores back, takes the new running maximum and turns its own
   score into a probability; then it accumulates its ``D / 32`` output dimensions over the
   tile's 32 probabilities and V rows, after rescaling them by how much the maximum grew.

Scores and probabilities never reach global memory, and Q, K, V are read from the packed QKV
tensor at their channel offsets, as on CPUs. No tensor cores: this kernel takes float32
attention and the float16 shapes the tensor-core kernel (``flash_attention.py``) does not.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from tvmfuse.names import IS_SCHEDULED, SCHEDULE
from tvmfuse.shapes import AttentionShape
from tvmfuse.targets import SM90_GPU, GpuFacts

from . import flash_attention

#: The name a kernel of this file reports as its implementation.
NAME = "cuda.attention"
#: The warp width: keys per tile, and lanes per query row.
WARP = 32
#: Warps (query rows) per thread block.
ROWS = 4
#: float16 attention of at least this many multiply-adds (QK^T and PV: 2 B H S S_kv D) that the
#: tensor-core kernel does not take is left unfused, its two batched matmuls to the tensor-core
#: GEMM (``matmul.py``) and its softmax to a warp a row (``rows.py``): this kernel's SIMT dot
#: products are far slower than tensor cores once the attention is large, as BERT-base's at batch
#: 32 (805 M; ``python -m tvmfuse inspect bert-base --target cuda-sm90 --dtype fp16 --batch 32
#: --profile`` with and without the ``fused_attention`` rule).
TENSOR_CORE_MACS = 1 << 27


def attention_kernel(shape: AttentionShape, gpu: GpuFacts = SM90_GPU) -> tirx.PrimFunc | None:
    """The scheduled CUDA kernel for ``shape``: the tensor-core kernel where it applies (float16
    and bfloat16, static shapes, heads a multiple of 16 wide), else this file's; None where
    neither does (symbolic shapes; in float32, queries and keys of different lengths) and for
    float16 attention large enough that its unfused matmuls on tensor cores win. The
    tensor-core kernel's blocks are sized for ``gpu``."""
    if flash_attention.supports(shape):
        return flash_attention.flash_attention_kernel(shape, gpu=gpu)
    return simt_attention_kernel(shape)


def simt_attention_kernel(shape: AttentionShape) -> tirx.PrimFunc | None:
    """This file's kernel for ``shape``, None where it does not apply (see
    ``attention_kernel``)."""
    if not all(isinstance(d, int) for d in (shape.batch, shape.seq, shape.kv_seq)) \
            or shape.kv_seq != shape.seq:
        return None
    macs = 2 * shape.batch * shape.heads * shape.seq * shape.kv_seq * shape.head_dim
    if shape.dtype == "float16" and macs >= TENSOR_CORE_MACS:
        return None
    B, S, H, D = shape.batch, shape.seq, shape.heads, shape.head_dim  # noqa: N806
    (CQ, QO), (CK, KO), (CV, VO) = shape.q, shape.k, shape.v  # noqa: N806
    MB, MH, MQ, MK = shape.mask  # noqa: N806
    fb, fh, fq, fk = (int(n != 1) for n in (MB, MH, MQ, MK))
    NQ = -(-S // ROWS)  # noqa: N806 - blocks per (batch, head)
    NT = -(-S // WARP)  # noqa: N806 - key tiles
    C = -(-D // WARP)  # noqa: N806 - output dimensions per lane
    P = 4 if D % 4 == 0 else 1  # noqa: N806 - partial sums of a dot product
    scale = float(shape.scale)
    dtype = shape.dtype

    @T.prim_func(private=True)
    def attention(q: T.Buffer((B, S, CQ), dtype), k: T.Buffer((B, S, CK), dtype),
                  v: T.Buffer((B, S, CV), dtype), mask: T.Buffer((MB, MH, MQ, MK), dtype),
                  out: T.Buffer((B, S, H * D), dtype)):
        T.func_attr({"tirx.noalias": True, IS_SCHEDULED: True, SCHEDULE: NAME})
        for block in T.thread_binding(B * H * NQ, thread="blockIdx.x"):
            for w in T.thread_binding(ROWS, thread="threadIdx.y"):
                for lane in T.thread_binding(WARP, thread="threadIdx.x"):
                    q_sh = T.decl_buffer((ROWS, D), "float32", scope="shared")
                    # flat, so that TVM's buffer compaction keeps the padding column
                    k_sh = T.decl_buffer((WARP * (D + 1),), "float32", scope="shared")
                    v_sh = T.decl_buffer((WARP, D), "float32", scope="shared")
                    s_sh = T.decl_buffer((ROWS, WARP), "float32", scope="shared")
                    p_sh = T.decl_buffer((ROWS, WARP), "float32", scope="shared")
                    acc = T.decl_buffer((C,), "float32", scope="local")
                    part = T.decl_buffer((P,), "float32", scope="local")
                    # 0 running max, 1 running sum, 2 new max, 3 rescale
                    st = T.decl_buffer((4,), "float32", scope="local")
                    b = block // (H * NQ)
                    h = block // NQ % H
                    i = T.min(block % NQ * ROWS + w, S - 1)  # rows past S: computed, not written
                    for c in T.unroll(C):
                        if c * WARP + lane < D:
                            q_sh[w, c * WARP + lane] = T.Cast(
                                "float32", q[b, i, QO + h * D + c * WARP + lane])
                        acc[c] = T.float32(0)
                    st[0] = T.min_value("float32")
                    st[1] = T.float32(0)
                    for t in range(NT):
                        T.tvm_storage_sync("shared")  # the previous tile is no longer read
                        for r in T.unroll(WARP // ROWS):
                            for c in T.unroll(C):
                                if c * WARP + lane < D:
                                    j = T.min(t * WARP + r * ROWS + w, S - 1)
                                    k_sh[(r * ROWS + w) * (D + 1) + c * WARP + lane] = T.Cast(
                                        "float32", k[b, j, KO + h * D + c * WARP + lane])
                                    v_sh[r * ROWS + w, c * WARP + lane] = T.Cast(
                                        "float32", v[b, j, VO + h * D + c * WARP + lane])
                        T.tvm_storage_sync("shared")
                        for p in T.unroll(P):
                            part[p] = T.float32(0)
                        for dd in T.unroll(D // P):
                            for p in T.unroll(P):
                                part[p] = part[p] + q_sh[w, dd * P + p] * k_sh[
                                    lane * (D + 1) + dd * P + p]
                        st[2] = T.float32(0)
                        for p in T.unroll(P):
                            st[2] = st[2] + part[p]
                        key = T.min(t * WARP + lane, S - 1)
                        s_sh[w, lane] = T.if_then_else(
                            t * WARP + lane < S,
                            st[2] * T.float32(scale) + T.Cast(
                                "float32", mask[b * fb, h * fh, i * fq, key * fk]),
                            T.min_value("float32"))
                        T.tvm_storage_sync("shared")
                        st[2] = st[0]
                        for jj in range(WARP):
                            st[2] = T.max(st[2], s_sh[w, jj])
                        st[3] = T.exp(st[0] - st[2])
                        p_sh[w, lane] = T.exp(s_sh[w, lane] - st[2])
                        st[0] = st[2]
                        T.tvm_storage_sync("shared")
                        st[1] = st[1] * st[3]
                        for c in T.unroll(C):
                            acc[c] = acc[c] * st[3]
                        for jj in range(WARP):
                            st[1] = st[1] + p_sh[w, jj]
                            for c in T.unroll(C):
                                if c * WARP + lane < D:
                                    acc[c] = acc[c] + p_sh[w, jj] * v_sh[jj, c * WARP + lane]
                    if block % NQ * ROWS + w < S:
                        for c in T.unroll(C):
                            if c * WARP + lane < D:
                                # a fully masked row (sum 0) gets 0; one that met a NaN
                                # keeps it (``sum == 0`` is false for NaN, ``sum > 0`` too)
                                out[b, i, h * D + c * WARP + lane] = T.Cast(dtype, T.if_then_else(
                                    st[1] == T.float32(0), T.float32(0), acc[c] / st[1]))

    return attention
