"""Fused multi-head attention on tensor cores (``mma.sync.m16n8k16``, float32 accumulation):
QK^T, an online softmax in registers and PV in one kernel, FlashAttention-2's loop, for float16
and bfloat16 models on sm_80 and later.

A thread block of ``warps`` warps takes ``16 * warps`` query rows of one (batch, head); each warp
owns 16 of them and walks the keys in tiles of :data:`BLOCK_KV`:

1. the block copies the tile's K and V rows to shared memory, 16 bytes a thread (rows padded by
   8 elements, so that ``ldmatrix``'s eight rows at one column fall in eight bank groups);
2. each warp multiplies its Q fragments (loaded once with ``ldmatrix``) by K^T: 16 x 64 scores
   in 32 float32 registers a thread, C fragments of eight ``m16n8`` tiles;
3. the scores are scaled, masked (the model's additive mask, and keys past the end), and the
   running row maximum and sum are updated with two shuffles among the four lanes that share a
   row; the accumulated output is rescaled by how much the maximum grew;
4. the probabilities, rounded to the input type, *are* the A fragments of PV (an m16n8 C
   fragment pair has the m16k16 A layout), so they never leave the registers; V's B fragments
   come from ``ldmatrix.trans``.

At the end each warp divides by the row sums, stages its 16 x D output in its own rows of the
(then unused) Q tile and stores them 16 bytes a thread. Scores never reach memory. Sizes need
not be multiples of the tiles: rows past the sequence read the last row and are not stored,
keys past it read the last key and weigh 0. Q, K and V are read from the packed projections at
their channel offsets, as the SIMT kernel (``attention.py``) does.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from tvmfuse.names import IS_SCHEDULED, SCHEDULE
from tvmfuse.shapes import AttentionShape
from tvmfuse.targets import SM90_GPU, GpuFacts

#: The name a kernel of this file reports as its implementation.
NAME = "cuda.flash_attention"
WARP = 32
#: Keys a tile: eight m16n8 score tiles, four k16 steps of PV.
BLOCK_KV = 64
#: Elements of padding a shared-memory row (16 bytes: rows 4 banks apart).
PAD = 8
#: ``mma`` operand types.
_MMA_TYPES = {"float16": "fp16", "bfloat16": "bf16"}


def supports(shape: AttentionShape) -> bool:
    """Static shapes, float16 or bfloat16, heads a multiple of 16 wide up to 256, and Q, K, V
    read 16 bytes at a time (channel counts and offsets multiples of 8)."""
    (cq, qo), (ck, ko), (cv, vo) = shape.q, shape.k, shape.v
    return (all(isinstance(d, int) for d in (shape.batch, shape.seq, shape.kv_seq))
            and shape.dtype in _MMA_TYPES and shape.head_dim % 16 == 0
            and shape.head_dim <= 256 and all(c % 8 == 0 for c in (cq, qo, ck, ko, cv, vo)))


def choose_warps(shape: AttentionShape, gpu: GpuFacts = SM90_GPU) -> int:
    """Warps a block: four (64 query rows, K and V read once for them) while that still makes
    a block for every SM of ``gpu``, fewer for small batches (BERT at batch 1: 12 heads x 128
    rows)."""
    for warps in (4, 2):
        if shape.batch * shape.heads * -(-shape.seq // (16 * warps)) >= gpu.sm_count:
            return warps
    return 1


def flash_attention_kernel(shape: AttentionShape, warps: int | None = None,
                           gpu: GpuFacts = SM90_GPU) -> tirx.PrimFunc:
    """The kernel for ``shape`` (``supports(shape)`` must hold), ``warps`` a block (by default
    :func:`choose_warps`'s for ``gpu``)."""
    if not supports(shape):
        raise ValueError(f"{shape} is not taken by the tensor-core attention kernel")
    warps = warps or choose_warps(shape, gpu)
    B, S, SK, H, D = shape.batch, shape.seq, shape.kv_seq, shape.heads, shape.head_dim  # noqa: N806
    (CQ, QO), (CK, KO), (CV, VO) = shape.q, shape.k, shape.v  # noqa: N806
    MB, MH, MQ, MK = shape.mask  # noqa: N806
    fb, fh, fq, fk = (int(n != 1) for n in (MB, MH, MQ, MK))
    dtype, mma_type = shape.dtype, _MMA_TYPES[shape.dtype]
    BQ = 16 * warps  # noqa: N806 - query rows a block
    NQ = -(-S // BQ)  # noqa: N806 - blocks a (batch, head)
    NT = -(-SK // BLOCK_KV)  # noqa: N806 - key tiles
    R = D + PAD  # noqa: N806 - shared-memory row
    NS = BLOCK_KV // 8  # noqa: N806 - m16n8 score tiles
    ND = D // 8  # noqa: N806 - m16n8 output tiles
    CHUNKS = D // 8  # noqa: N806 - 16-byte pieces of a row
    THREADS = WARP * warps  # noqa: N806
    scale = float(shape.scale)

    # fmt: off
    @T.prim_func(private=True)
    def attention(q: T.Buffer((B, S, CQ), dtype), k: T.Buffer((B, SK, CK), dtype),
                  v: T.Buffer((B, SK, CV), dtype), mask: T.Buffer((MB, MH, MQ, MK), dtype),
                  out: T.Buffer((B, S, H * D), dtype)):
        T.func_attr({"tirx.noalias": True, IS_SCHEDULED: True, SCHEDULE: NAME})
        for block in T.thread_binding(B * H * NQ, thread="blockIdx.x"):
            for w in T.thread_binding(warps, thread="threadIdx.y"):
                for lane in T.thread_binding(WARP, thread="threadIdx.x"):
                    q_sh = T.decl_buffer((BQ * R,), dtype, scope="shared.dyn", align=16)
                    k_sh = T.decl_buffer((BLOCK_KV * R,), dtype, scope="shared.dyn", align=16)
                    v_sh = T.decl_buffer((BLOCK_KV * R,), dtype, scope="shared.dyn", align=16)
                    q_frag = T.decl_buffer((D // 2,), dtype, scope="local", align=16)
                    kv_frag = T.decl_buffer((8,), dtype, scope="local", align=16)
                    p_frag = T.decl_buffer((BLOCK_KV // 2,), dtype, scope="local", align=16)
                    s_acc = T.decl_buffer((NS * 4,), "float32", scope="local")
                    o_acc = T.decl_buffer((ND * 4,), "float32", scope="local")
                    # per row of the thread (lane / 4 and lane / 4 + 8): running max, running
                    # sum, the tile's max, the shift of the exponentials, the rescale
                    row_max = T.decl_buffer((2,), "float32", scope="local")
                    row_sum = T.decl_buffer((2,), "float32", scope="local")
                    tile_max = T.decl_buffer((2,), "float32", scope="local")
                    shift = T.decl_buffer((2,), "float32", scope="local")
                    b = T.meta_var(block // (H * NQ))
                    h = T.meta_var(block // NQ % H)
                    first = T.meta_var(block % NQ * BQ)
                    tid = T.meta_var(w * WARP + lane)
                    for it in T.unroll(-(-BQ * CHUNKS // THREADS)):
                        if it * THREADS + tid < BQ * CHUNKS:
                            for e in T.vectorized(8):
                                q_sh[(it * THREADS + tid) // CHUNKS * R
                                     + (it * THREADS + tid) % CHUNKS * 8 + e] = q[
                                    b, T.min(first + (it * THREADS + tid) // CHUNKS, S - 1),
                                    QO + h * D + (it * THREADS + tid) % CHUNKS * 8 + e]
                    T.tvm_storage_sync("shared")
                    # A fragments of the warp's 16 rows, k16 step kk at q_frag[kk * 8]
                    for kk in T.unroll(D // 16):
                        T.ptx_legacy.ldmatrix(
                            False, 4, ".b16", q_frag.data, kk * 8, q_sh.access_ptr("r"),
                            (w * 16 + lane % 16) * R + kk * 16 + lane // 16 * 8, dtype=dtype)
                    for i in T.unroll(ND * 4):
                        o_acc[i] = T.float32(0)
                    for r in T.unroll(2):
                        row_max[r] = T.min_value("float32")
                        row_sum[r] = T.float32(0)
                    for t in T.serial(NT):
                        T.tvm_storage_sync("shared")  # the previous tile is no longer read
                        for it in T.unroll(-(-BLOCK_KV * CHUNKS // THREADS)):
                            if it * THREADS + tid < BLOCK_KV * CHUNKS:
                                for e in T.vectorized(8):
                                    k_sh[(it * THREADS + tid) // CHUNKS * R
                                         + (it * THREADS + tid) % CHUNKS * 8 + e] = k[
                                        b, T.min(t * BLOCK_KV + (it * THREADS + tid) // CHUNKS,
                                                 SK - 1),
                                        KO + h * D + (it * THREADS + tid) % CHUNKS * 8 + e]
                                for e in T.vectorized(8):
                                    v_sh[(it * THREADS + tid) // CHUNKS * R
                                         + (it * THREADS + tid) % CHUNKS * 8 + e] = v[
                                        b, T.min(t * BLOCK_KV + (it * THREADS + tid) // CHUNKS,
                                                 SK - 1),
                                        VO + h * D + (it * THREADS + tid) % CHUNKS * 8 + e]
                        T.tvm_storage_sync("shared")
                        # scores: S tile j (keys 8j..8j+7) at s_acc[j * 4]
                        for i in T.unroll(NS * 4):
                            s_acc[i] = T.float32(0)
                        for kk in T.unroll(D // 16):
                            for j in T.unroll(NS // 2):
                                # B fragments of key tiles 2j and 2j + 1 at d = 16 kk
                                T.ptx_legacy.ldmatrix(
                                    False, 4, ".b16", kv_frag.data, 0, k_sh.access_ptr("r"),
                                    (j * 16 + lane // 16 * 8 + lane % 8) * R + kk * 16
                                    + lane // 8 % 2 * 8, dtype=dtype)
                                for half in T.unroll(2):
                                    T.ptx_legacy.mma(
                                        "m16n8k16", "row", "col", mma_type, mma_type, "fp32",
                                        q_frag.data, kk * 8, kv_frag.data, half * 4,
                                        s_acc.data, (j * 2 + half) * 4, False, dtype="float32")
                        # C fragment element e of tile j: row lane / 4 + 8 (e // 2),
                        # key 8 j + 2 (lane % 4) + e % 2
                        for r in T.unroll(2):
                            tile_max[r] = row_max[r]
                        for j in T.unroll(NS):
                            for e in T.unroll(4):
                                s_acc[j * 4 + e] = T.if_then_else(
                                    t * BLOCK_KV + j * 8 + lane % 4 * 2 + e % 2 < SK,
                                    s_acc[j * 4 + e] * T.float32(scale) + T.Cast("float32", mask[
                                        b * fb, h * fh,
                                        T.min(first + w * 16 + lane // 4 + e // 2 * 8, S - 1) * fq,
                                        T.min(t * BLOCK_KV + j * 8 + lane % 4 * 2 + e % 2,
                                              SK - 1) * fk]),
                                    T.min_value("float32"))
                                tile_max[e // 2] = T.max(tile_max[e // 2], s_acc[j * 4 + e])
                        for r in T.unroll(2):
                            for offset in T.unroll(2):
                                tile_max[r] = T.max(tile_max[r], T.tvm_warp_shuffle_xor(
                                    T.uint32(0xFFFFFFFF), tile_max[r], 1 << offset, WARP, WARP))
                            shift[r] = T.exp(row_max[r] - tile_max[r])  # the rescale
                            row_max[r] = tile_max[r]
                            row_sum[r] = row_sum[r] * shift[r]
                        for j in T.unroll(ND):
                            for e in T.unroll(4):
                                o_acc[j * 4 + e] = o_acc[j * 4 + e] * shift[e // 2]
                        for j in T.unroll(NS):
                            for e in T.unroll(4):
                                s_acc[j * 4 + e] = T.exp(s_acc[j * 4 + e] - row_max[e // 2])
                                row_sum[e // 2] = row_sum[e // 2] + s_acc[j * 4 + e]
                                # A fragment of PV's k16 step j // 2: tiles 2j, 2j + 1 side by side
                                p_frag[j // 2 * 8 + j % 2 * 4 + e] = T.Cast(dtype, s_acc[j * 4 + e])
                        for kk in T.unroll(BLOCK_KV // 16):
                            for j in T.unroll(ND // 2):
                                # B fragments of output tiles 2j and 2j + 1 at keys 16 kk
                                T.ptx_legacy.ldmatrix(
                                    True, 4, ".b16", kv_frag.data, 0, v_sh.access_ptr("r"),
                                    (kk * 16 + lane // 8 % 2 * 8 + lane % 8) * R + j * 16
                                    + lane // 16 * 8, dtype=dtype)
                                for half in T.unroll(2):
                                    T.ptx_legacy.mma(
                                        "m16n8k16", "row", "col", mma_type, mma_type, "fp32",
                                        p_frag.data, kk * 8, kv_frag.data, half * 4,
                                        o_acc.data, (j * 2 + half) * 4, False, dtype="float32")
                    for r in T.unroll(2):
                        for offset in T.unroll(2):
                            row_sum[r] = row_sum[r] + T.tvm_warp_shuffle_xor(
                                T.uint32(0xFFFFFFFF), row_sum[r], 1 << offset, WARP, WARP)
                    # the warp's rows of the Q tile (read only into its fragments) stage the output
                    for j in T.unroll(ND):
                        for e in T.unroll(4):
                            q_sh[(w * 16 + lane // 4 + e // 2 * 8) * R + j * 8 + lane % 4 * 2
                                 + e % 2] = T.Cast(dtype, T.if_then_else(
                                     row_sum[e // 2] == T.float32(0), T.float32(0),
                                     o_acc[j * 4 + e] / row_sum[e // 2]))
                    T.tvm_storage_sync("warp")
                    for it in T.unroll(-(-16 * CHUNKS // WARP)):
                        if it * WARP + lane < 16 * CHUNKS:
                            if first + w * 16 + (it * WARP + lane) // CHUNKS < S:
                                for e in T.vectorized(8):
                                    out[b, first + w * 16 + (it * WARP + lane) // CHUNKS,
                                        h * D + (it * WARP + lane) % CHUNKS * 8 + e] = q_sh[
                                        (w * 16 + (it * WARP + lane) // CHUNKS) * R
                                        + (it * WARP + lane) % CHUNKS * 8 + e]
    # fmt: on
    return attention
