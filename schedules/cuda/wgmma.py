"""GEMMs on Hopper's ``wgmma``: a warp-specialized TIRx kernel fed by TMA through an mbarrier
pipeline, for the large fp16 and bf16 GEMMs, where ``mma.sync`` (``matmul.py``, ``mma_gemm.py``)
keeps the tensor cores busy only part of the time: an mma.sync warp waits for its operands in
registers, a wgmma reads them from shared memory while the warpgroup goes on
(``python3 benchmarks/cuda_gemm.py --tiles auto,mk,wgmma`` compares the three).

``C[m, n] = epilogue(sum_k A[m, k] * B[n, k], m, n)``, both operands K-major (a torch weight's
[N, K] layout), float32 accumulation:

- one thread block per ``block_m x block_n`` tile of C (grouped along M so that neighbouring
  blocks share B's tiles in L2), three warpgroups;
- warpgroup 0 is the producer: one thread issues the TMA copies of A's and B's ``block_k = 64``
  column tiles (128 bytes a row, TMA's 128-byte swizzle, so wgmma reads them without bank
  conflicts) into ``stages`` shared-memory slots, each with a *full* and an *empty* mbarrier;
- warpgroups 1 and 2 own 64 rows each: four ``wgmma.m64n{block_n}k16`` a slot from the two
  swizzled tiles (matrix descriptors, no register copy), one wgmma group kept in flight, the slot
  released to the producer when the group before it completes;
- the accumulators (``block_n / 2`` float32 registers a thread; ``setmaxnreg`` moves registers
  from the producer to the consumers) are staged in the freed pipeline slots, then each thread
  applies the epilogue to 8 consecutive columns and stores them as one 16-byte vector,
  predicated at M's and N's edges.

Sizes need not be multiples of the tile: TMA reads zeros outside A and B (so K's last step adds
zeros), and the stores skip rows and columns outside C. K must be a multiple of 8 (TMA's global
strides are multiples of 16 bytes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm.script import tirx as T

from tvmfuse.targets import SM90_GPU, GpuFacts

from .wgmma_tile import (
    BLOCK_K,
    STAGED_PAD,
    WG_M,
    WG_THREADS,
    ConvGeometry,
    WgmmaTile,
    choose_wgmma_tile,
)

#: The name a kernel of this file reports as its implementation.
NAME = "cuda.wgmma_gemm"
#: wgmma's K per instruction.
WG_K = 16
#: M tiles grouped together in the launch order (L2 reuse of B's tiles).
GROUP_M = 8
#: TMA's swizzle mode and the wgmma descriptor's for 128-byte rows (CU_TENSOR_MAP_SWIZZLE_128B).
SWIZZLE_128B = 3
#: The descriptor's stride between 8-row groups, in 16-byte units: 8 rows of 128 bytes.
SWIZZLE_ATOM_STRIDE = 8 * 128 // 16


#: ``epilogue(acc, row, col) -> value``: the accumulator (float32) at C[row, col] to the value
#: stored; the buffers it reads (a bias, a residual) become the kernel's parameters.
Epilogue = Callable[["tvm.ir.PrimExpr", "tvm.ir.PrimExpr", "tvm.ir.PrimExpr"], "tvm.ir.PrimExpr"]


#: Buffers of C's size an epilogue may read through an [m, n] view (see :func:`gemm_kernel`).
ROW_VIEWS = 2

#: Threads of a warp; rows of a consumer warpgroup's 64 each of its four warps normalizes.
WARP = 32
WARP_ROWS = WG_M // 4


@dataclass(frozen=True)
class RowNorm:
    """A normalization of C's rows after the GEMM (LayerNorm, RMSNorm: ``layer_norm(x @ W + b
    + residual)``), computed in the kernel's epilogue: the epilogue's value is the row element
    ``x`` (of ``x_dtype``); then one or two row sums, ``term(x, row, col, sums)`` summed over
    the row's columns (``sums``: the totals of the sums before it: LayerNorm's variance reads
    its mean's sum); then ``output(x, row, col, sums)`` is stored. A row spans the thread
    blocks of one cluster (one a column tile), which add their partial sums through
    distributed shared memory."""

    x_dtype: str
    terms: tuple[Callable, ...]
    output: Callable


def gemm_kernel(m: int, n: int, k: int, tile: WgmmaTile | None = None,
                out_dtype: str = "float16", in_dtype: str = "float16",
                epilogue: Epilogue | None = None,
                extra: tuple[tvm.tirx.Buffer, ...] = (),
                a_shape: tuple | None = None, b_shape: tuple | None = None,
                c_shape: tuple | None = None,
                conv: ConvGeometry | None = None,
                row_views: dict | None = None,
                row_norm: RowNorm | None = None,
                gpu: GpuFacts = SM90_GPU) -> tvm.tirx.PrimFunc:
    """The TIRx PrimFunc ``(A [m, k], B [n, k], *extra, C [m, n])``: ``epilogue(acc, row, col)``
    gives the value stored at C[row, col] (by default the accumulator cast to ``out_dtype``),
    reading the buffers ``extra`` (``tvm.tirx.decl_buffer``s), which become parameters.
    ``row_views`` maps up to :data:`ROW_VIEWS` of ``extra`` (buffers of C's size, a residual)
    to None; the kernel declares each as [m, n], as it does C, loads the elements of a thread's
    columns as one vector, and before it builds the epilogue puts in their place a function
    ``(row, col) -> value`` that reads them, which the epilogue calls for its loads of that
    buffer.
    ``a_shape`` and ``c_shape`` declare A and C with leading batch axes (rows are their
    product: a linear layer's [batch, seq, features], an NHWC conv's [N, H, W, C]), ``b_shape``
    B with unit axes (a 1x1 conv's OHWI weight, [N, 1, 1, K]). With ``conv`` the kernel is that
    conv's implicit GEMM: A is its NHWC input, B its OHWI weight, rows its output pixels.
    With ``row_norm`` (a :class:`RowNorm`) the epilogue's value is a row element that the
    kernel normalizes before the store: the column tiles of a row are one cluster's blocks.
    The tile is chosen for and checked against ``gpu``."""
    rows = conv.rows if conv else m  # a conv's output rows padded to whole segments
    k_steps = conv.k_steps if conv else math.ceil(k / BLOCK_K)
    tile = tile or choose_wgmma_tile(rows, n, gpu, conv=conv is not None, k_steps=k_steps)
    tile.validate(gpu)
    if k % 8 or conv and conv.channels % 8:
        raise ValueError(f"K = {k}: TMA needs K (a conv's channels) a multiple of 8 "
                         "(16-byte rows)")
    bm, bn, stages, consumers = tile.block_m, tile.block_n, tile.stages, tile.consumers
    tiles_m, tiles_n = math.ceil(rows / bm), math.ceil(n / bn)
    group = GROUP_M * tiles_n
    acc_len = bn // 2
    # 16-byte stores where C's rows keep them aligned
    vec = 8 if n % 8 == 0 else 1
    seg = conv.segment if conv else 0
    consumer_registers, producer_registers = tile.registers(gpu)
    # producer threads issuing copies: a conv's segments one a thread (their copies may land
    # before thread 0's expect_tx: the barrier's count of bytes goes below zero until then)
    copiers = bm // seg if conv else 1
    taps = conv.window[0] * conv.window[1] if conv else 0
    a_stage, b_stage = bm * BLOCK_K, bn * BLOCK_K
    stage_bytes = (a_stage + b_stage) * 2
    ab = {"float16": "f16", "bfloat16": "bf16"}[in_dtype]
    mma = f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{ab}.{ab}"
    # TMA's tile copies of 2, 3 and 4 dimensions, counted on the slot's mbarrier
    tma_2d, tma_3d, tma_4d = (
        f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes"
        for rank in (2, 3, 4))
    if epilogue is None:
        def epilogue(acc, row, col):  # noqa: ARG001
            return T.Cast(out_dtype, acc)
    viewed = list(row_views or {})
    if len(viewed) > ROW_VIEWS:
        raise ValueError(f"{len(viewed)} row views: at most {ROW_VIEWS}")
    # a row normalization: its sums (one or two), the cluster barriers each takes
    norm_terms = row_norm.terms if row_norm else ()
    cluster = tiles_n if row_norm else 1
    value_dtype = row_norm.x_dtype if row_norm is not None else out_dtype
    peer_loads = math.ceil(cluster / 2)  # remote partial sums a lane loads (see the epilogue)
    lane_columns = math.ceil(bn / WARP)  # columns of a row a lane sums
    if row_norm is not None:
        if conv is not None or vec != 8 or not 1 <= len(norm_terms) <= 2:
            raise ValueError("a row normalization needs a GEMM (not a conv) with N a multiple "
                             "of 8 and one or two row sums")
        if tiles_n > gpu.max_cluster_size:
            raise ValueError(f"N = {n} in {tiles_n} tiles of {bn}: a normalized row spans at "
                             f"most {gpu.max_cluster_size} (a cluster)")

    # fmt: off
    @T.prim_func(check_well_formed=False)  # the epilogue's buffers are added as parameters below
    def kernel(a_handle: T.handle, b_handle: T.handle, c_handle: T.handle):
        A = T.match_buffer(a_handle, a_shape or (m, k), in_dtype, align=16)
        B = T.match_buffer(b_handle, b_shape or (n, k), in_dtype, align=16)
        C_param = T.match_buffer(c_handle, c_shape or (m, n), out_dtype, align=16)
        a_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        b_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        if conv is None:
            T.call_packed("runtime.cuTensorMapEncodeTiled", a_map, in_dtype, 2, A.data,
                          k, m, k * 2, BLOCK_K, bm, 1, 1, 0, SWIZZLE_128B, 0, 0)
            T.call_packed("runtime.cuTensorMapEncodeTiled", b_map, in_dtype, 2, B.data,
                          k, n, k * 2, BLOCK_K, bn, 1, 1, 0, SWIZZLE_128B, 0, 0)
        else:
            # A: the input (C, W, H, N) innermost first, a box of 64 channels x `seg` pixels
            # of one row taken `stride` apart; B: the weight as (C, taps, O)
            T.call_packed("runtime.cuTensorMapEncodeTiled", a_map, in_dtype, 4, A.data,
                          conv.channels, conv.width, conv.height, conv.batch,
                          conv.channels * 2, conv.width * conv.channels * 2,
                          conv.height * conv.width * conv.channels * 2,
                          BLOCK_K, seg * conv.stride[1], 1, 1, 1, conv.stride[1], 1, 1,
                          0, SWIZZLE_128B, 0, 0)
            T.call_packed("runtime.cuTensorMapEncodeTiled", b_map, in_dtype, 3, B.data,
                          conv.channels, taps, n, conv.channels * 2, taps * conv.channels * 2,
                          BLOCK_K, 1, bn, 1, 1, 1, 0, SWIZZLE_128B, 0, 0)

        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": tile.blocks_per_sm})
        bid = T.cta_id([tiles_m * tiles_n])
        if row_norm is not None:
            rank = T.cta_id_in_cluster([cluster])  # (a launch in clusters of `cluster` blocks)
        wg = T.warpgroup_id([consumers + 1])
        tid = T.thread_id_in_wg([WG_THREADS])

        arena = T.alloc_buffer((tile.shared_bytes() // 2,), in_dtype, scope="shared.dyn",
                               align=1024)
        a_smem = T.decl_buffer((stages, bm, BLOCK_K), in_dtype, data=arena.data,
                               scope="shared.dyn")
        b_smem = T.decl_buffer((stages, bn, BLOCK_K), in_dtype, data=arena.data,
                               elem_offset=stages * a_stage, scope="shared.dyn")
        C = T.decl_buffer((m, n), out_dtype, data=C_param.data)
        if len(viewed) > 0:
            R0 = T.decl_buffer((m, n), viewed[0].dtype, data=viewed[0].data)
            r0 = T.alloc_local((vec,), viewed[0].dtype)
        if len(viewed) > 1:
            R1 = T.decl_buffer((m, n), viewed[1].dtype, data=viewed[1].data)
            r1 = T.alloc_local((vec,), viewed[1].dtype)
        staged = T.decl_buffer((bm, bn + STAGED_PAD), "float32", data=arena.data,
                               scope="shared.dyn")

        @T.inline
        def load_row_views(row, col):
            """The row views' elements from C[row, col] on loaded as one vector each, into
            registers (the epilogue's reads of them then read the registers)."""
            if len(viewed) > 0:
                for e in T.vectorized(vec):
                    r0[e] = R0[row, col + e]
                _v0 = T.meta_var(_view(row_views, viewed[0], r0, col))
            if len(viewed) > 1:
                for e in T.vectorized(vec):
                    r1[e] = R1[row, col + e]
                _v1 = T.meta_var(_view(row_views, viewed[1], r1, col))

        full = T.alloc_shared((stages,), "uint64")
        empty = T.alloc_shared((stages,), "uint64")

        if row_norm is None:
            # grouped launch order: GROUP_M tiles of M share each tile of N
            first_m = T.meta_var(bid // group * GROUP_M)
            group_m = T.meta_var(T.min(tiles_m - first_m, GROUP_M))
            tile_m = T.meta_var(first_m + bid % group % group_m)
            tile_n = T.meta_var(bid % group // group_m)
        else:
            # a cluster a tile of M, its blocks the tiles of N
            tile_m = T.meta_var(bid // cluster)
            tile_n = T.meta_var(rank)
            parts = T.alloc_shared((2, bm), "float32")  # the sums over this block's columns
            stats = T.alloc_shared((2, bm), "float32")  # the cluster's totals

        if wg == 0 and tid == 0:
            for s in T.unroll(stages):
                T.ptx.mbarrier.init.shared.b64(T.address_of(full[s]), T.uint32(1))
                T.ptx.mbarrier.init.shared.b64(T.address_of(empty[s]),
                                               T.uint32(consumers * WG_THREADS))
        T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()

        if wg == 0:
            T.ptx["setmaxnreg.dec.sync.aligned.u32"](producer_registers)
            if tid < copiers:
                for kt in T.serial(k_steps):
                    s = T.meta_var(kt % stages)
                    if kt >= stages:
                        T.cuda.mbarrier_wait(T.address_of(empty[s]), (kt // stages + 1) % 2)
                    if tid == 0:
                        T.ptx.mbarrier.arrive.expect_tx.shared.b64(T.address_of(full[s]),
                                                                   T.uint32(stage_bytes))
                    if conv is None:
                        T.ptx[tma_2d](
                            a_smem.ptr_to([s, 0, 0]), T.address_of(a_map), kt * BLOCK_K,
                            tile_m * bm, T.address_of(full[s]))
                        T.ptx[tma_2d](
                            b_smem.ptr_to([s, 0, 0]), T.address_of(b_map), kt * BLOCK_K,
                            tile_n * bn, T.address_of(full[s]))
                    else:
                        # step kt: 64 channels from c0 of tap (ty, tx); thread `tid` copies
                        # segment tid of the tile, output row `noh` (image * OH + oh) from
                        # pixel `ow` (a thread a copy: one thread computing every segment's
                        # coordinates serializes a step's address math ahead of its copies,
                        # which slows the convs of many segments, 56x56 3x3:
                        # ``python3 benchmarks/cuda_conv.py``)
                        tap = T.meta_var(kt // conv.channel_steps)
                        c0 = T.meta_var(kt % conv.channel_steps * BLOCK_K)
                        ty = T.meta_var(tap // conv.window[1])
                        tx = T.meta_var(tap % conv.window[1])
                        segment = T.meta_var(tile_m * (bm // seg) + tid)
                        noh = T.meta_var(segment // conv.segments_per_row)
                        ow = T.meta_var(segment % conv.segments_per_row * seg)
                        T.ptx[tma_4d](
                            a_smem.ptr_to([s, tid * seg, 0]), T.address_of(a_map), c0,
                            ow * conv.stride[1] + tx * conv.dilation[1] - conv.padding[1],
                            noh % conv.out_height * conv.stride[0]
                            + ty * conv.dilation[0] - conv.padding[0],
                            noh // conv.out_height, T.address_of(full[s]))
                        if tid == 0:
                            T.ptx[tma_3d](
                                b_smem.ptr_to([s, 0, 0]), T.address_of(b_map), c0, tap,
                                tile_n * bn, T.address_of(full[s]))
            # every thread of a cluster arrives at its barriers: the consumers' sums take one
            # each, and one more keeps each block's partial sums until its peers have read them
            for _ in T.unroll(len(norm_terms) + 1 if row_norm is not None else 0):
                _cluster_barrier()
        else:
            T.ptx["setmaxnreg.inc.sync.aligned.u32"](consumer_registers)
            acc = T.alloc_local((acc_len,), "float32")
            # TVMScript declarations: names the parser binds, which pyflakes cannot see
            desc_a: T.uint64
            desc_b: T.uint64
            for i in T.unroll(acc_len):
                acc[i] = T.float32(0)
            for kt in T.serial(k_steps):
                s = T.meta_var(kt % stages)
                T.cuda.mbarrier_wait(T.address_of(full[s]), kt // stages % 2)
                T.ptx.wgmma.fence.sync.aligned()
                for kk in T.unroll(BLOCK_K // WG_K):
                    T.cuda.wgmma.encode_matrix_descriptor(
                        T.address_of(desc_a),  # noqa: F821
                        a_smem.ptr_to([s, (wg - 1) * WG_M, kk * WG_K]),
                        1, SWIZZLE_ATOM_STRIDE, SWIZZLE_128B)
                    T.cuda.wgmma.encode_matrix_descriptor(
                        T.address_of(desc_b), b_smem.ptr_to([s, 0, kk * WG_K]),  # noqa: F821
                        1, SWIZZLE_ATOM_STRIDE, SWIZZLE_128B)
                    T.ptx[mma](*_elements(acc, acc_len), desc_a, desc_b,  # noqa: F821
                               T.bool(True),
                               1, 1, 0, 0)
                T.ptx.wgmma.commit_group.sync.aligned()
                # the group before this one has read its slot: hand that slot back
                T.ptx.wgmma.wait_group.sync.aligned(1)
                if kt > 0:
                    T.ptx.mbarrier.arrive.shared.b64(
                        T.address_of(empty[(kt + stages - 1) % stages]))
            T.ptx.wgmma.wait_group.sync.aligned(0)

            # The accumulators go through shared memory (the pipeline's slots, free once both
            # consumers have passed their last wgmma) so that each thread then applies the
            # epilogue to `vec` consecutive columns and stores them as one vector: stored from
            # the fragments, four threads would write 16 bytes of a row, 2 bytes at a time.
            # Accumulator j*4 + e of a thread: row 16 * warp + lane / 4 (+ 8 for e >= 2),
            # column 8 * j + 2 * (lane % 4) (+ 1 for odd e).
            T.ptx.bar.sync(T.uint32(1), T.uint32(consumers * WG_THREADS))
            # The consumer's first row. `wg` is a warp shuffle's value to TVM's analysis (no
            # bounds), so `wg - 1` as such may be negative to it, and a conv's output row
            # (divisions of this row) would lower to floor divisions of an unbounded value,
            # whose offsets overflow int32 (a Wav2Vec2 conv of 1599 pixels: "Literal value
            # 17581191353856 exceeds range of int32"). Clamped to the consumers' range, every
            # row is provably non-negative and its divisions plain ones.
            wg_row = T.meta_var((T.min(T.max(wg, 1), consumers) - 1) * WG_M)
            # the epilogue's values: the stored ones, or the row elements a normalization takes
            value = T.alloc_local((vec,), value_dtype)
            for j in T.unroll(bn // 8):
                for e in T.unroll(4):
                    staged[wg_row + tid // 32 * 16 + tid % 32 // 4 + e // 2 * 8,
                           j * 8 + tid % 4 * 2 + e % 2] = acc[j * 4 + e]
            T.ptx.bar.sync(T.Cast("uint32", 1 + wg), T.uint32(WG_THREADS))
            # Each thread applies the epilogue to `vec` consecutive columns of rows spread over
            # the warpgroup (its loads all independent: the compiler issues them together) and
            # stores them as one vector; with a row normalization the values (the row elements)
            # go back to `staged` instead, and are normalized and stored below.
            for it in T.unroll(WG_M * bn // vec // WG_THREADS):
                r = T.meta_var((it * WG_THREADS + tid) // (bn // vec))
                c = T.meta_var((it * WG_THREADS + tid) % (bn // vec) * vec)
                row, stored = T.meta_var(_output_row(tile_m * bm + wg_row + r, m, conv))
                col = T.meta_var(tile_n * bn + c)
                if stored and col + vec <= n:
                    load_row_views(row, col)
                    # computed into registers, then stored as one vector: TVM scalarizes a
                    # vectorized loop whose value calls a function without a vector form (GELU's
                    # erf), and with it the store (2 bytes at a time: FFN1 at half the GEMM's speed)
                    for e in T.unroll(vec):
                        value[e] = epilogue(staged[wg_row + r, c + e], row, col + e)
                    if row_norm is None:
                        for e in T.vectorized(vec):
                            C[row, col + e] = value[e]
                    else:
                        for e in T.unroll(vec):
                            staged[wg_row + r, c + e] = T.Cast("float32", value[e])
                elif stored and row_norm is None:
                    if len(viewed) > 0:
                        _w0 = T.meta_var(_view(row_views, viewed[0], R0))
                    if len(viewed) > 1:
                        _w1 = T.meta_var(_view(row_views, viewed[1], R1))
                    for e in T.serial(vec):
                        if col + e < n:
                            C[row, col + e] = epilogue(staged[wg_row + r, c + e], row, col + e)
            if row_norm is not None:
                # Rows past M keep their zero accumulators (from TMA's zeros): summed, never
                # stored. Each warp sums 16 rows, lane l columns l, l + 32, ... (conflict-free
                # shared loads), a row's partial sum across the lanes by shuffles; the cluster's
                # blocks add their partial sums in rank order (every block the same totals),
                # which go to `stats` for the store below, in the spread above.
                T.ptx.bar.sync(T.Cast("uint32", 1 + wg), T.uint32(WG_THREADS))
                warp = T.meta_var(tid // WARP)
                lane = T.meta_var(tid % WARP)
                totals = T.alloc_local((WARP_ROWS,), "float32")
                partial = T.alloc_local((1,), "float32")
                got = T.alloc_local((peer_loads,), "float32")
                mapped = T.alloc_local((1,), "uint32")
                out = T.alloc_local((vec,), out_dtype)  # the normalized values

                @T.inline
                def row_sum(step, term):
                    """Sum ``term`` over each row; the totals into ``stats[step]`` and, where
                    a sum follows, ``totals`` (the warp's 16 rows' in every lane)."""
                    for i in T.unroll(WARP_ROWS):
                        r = T.meta_var(wg_row + warp * WARP_ROWS + i)
                        # (a term's loads at rows past M read row M - 1)
                        row = T.meta_var(T.min(tile_m * bm + r, m - 1))
                        partial[0] = T.float32(0)
                        for e in T.unroll(lane_columns):
                            c = T.meta_var(lane + WARP * e)
                            if c < bn and tile_n * bn + c < n:
                                partial[0] = partial[0] + term(
                                    T.Cast(row_norm.x_dtype, staged[r, c]), row,
                                    tile_n * bn + c, [totals[i]])
                        for lanes in T.unroll(5):
                            partial[0] = partial[0] + T.tvm_warp_shuffle_xor(
                                T.uint32(0xFFFFFFFF), partial[0], 16 >> lanes, WARP, WARP)
                        if lane == 0:
                            parts[step, r] = partial[0]
                    _cluster_barrier()
                    # a lane a row and half the peers (lanes 16 on the other half): every
                    # remote load is issued before the first is added
                    for j in T.unroll(peer_loads):
                        peer = T.meta_var(lane // WARP_ROWS + 2 * j)
                        got[j] = T.float32(0)
                        if peer < cluster:
                            T.evaluate(T.ptx.mapa.shared__cluster.u32(
                                mapped[0], T.cuda.cvta_generic_to_shared(parts.ptr_to(
                                    [step, wg_row + warp * WARP_ROWS + lane % WARP_ROWS])),
                                T.Cast("uint32", peer)))
                            T.ptx["ld.shared::cluster.f32"](got[j], mapped[0])
                    partial[0] = T.float32(0)
                    for j in T.unroll(peer_loads):
                        partial[0] = partial[0] + got[j]
                    partial[0] = partial[0] + T.tvm_warp_shuffle_xor(
                        T.uint32(0xFFFFFFFF), partial[0], WARP_ROWS, WARP, WARP)
                    if lane < WARP_ROWS:
                        stats[step, wg_row + warp * WARP_ROWS + lane] = partial[0]
                    if step + 1 < len(norm_terms):
                        for i in T.unroll(WARP_ROWS):
                            totals[i] = T.tvm_warp_shuffle(
                                T.uint32(0xFFFFFFFF), partial[0], i, WARP, WARP)

                row_sum(0, norm_terms[0])
                if len(norm_terms) > 1:
                    row_sum(1, norm_terms[-1])
                # this block's partial sums are read (its own last loads are done): arrive
                # now, wait before exiting, when every peer has read them
                T.ptx["barrier.cluster.arrive.release"]()
                T.ptx.bar.sync(T.Cast("uint32", 1 + wg), T.uint32(WG_THREADS))
                for it in T.unroll(WG_M * bn // vec // WG_THREADS):
                    r = T.meta_var((it * WG_THREADS + tid) // (bn // vec))
                    c = T.meta_var((it * WG_THREADS + tid) % (bn // vec) * vec)
                    row = T.meta_var(tile_m * bm + wg_row + r)
                    col = T.meta_var(tile_n * bn + c)
                    if row < m and col < n:
                        for e in T.unroll(vec):
                            out[e] = row_norm.output(
                                T.Cast(row_norm.x_dtype, staged[wg_row + r, c + e]), row,
                                col + e, [stats[0, wg_row + r], stats[1, wg_row + r]])
                        for e in T.vectorized(vec):
                            C[row, col + e] = out[e]
                T.ptx["barrier.cluster.wait.acquire"]()
    # fmt: on
    return with_params(kernel, extra)


@T.inline
def _cluster_barrier():
    """Every thread of the cluster arrives, then waits for all (release / acquire: the shared
    memory written before is visible to the cluster's blocks after)."""
    T.ptx["barrier.cluster.arrive.release"]()
    T.ptx["barrier.cluster.wait.acquire"]()


def _view(views: dict, buffer: tvm.tirx.Buffer, source: tvm.tirx.Buffer, col=None) -> None:
    """Point ``views[buffer]`` (an epilogue's read of ``buffer`` at (row, col), see
    :func:`gemm_kernel`) at ``source``: the [m, n] view itself, or (``col`` given) the
    registers holding the view's elements from column ``col`` on."""
    if col is None:
        views[buffer] = lambda row, c: source[row, c]
    else:
        views[buffer] = lambda row, c: source[c - col]


def _output_row(tile_row, m: int, conv: ConvGeometry | None):
    """``(row of C, whether it is stored)`` for a row of the tiles laid end to end: the same
    row below ``m`` for a GEMM; for a conv, the output pixel of that segment's row, stored
    unless past the output row's end (or the last image)."""
    if conv is None:
        return tile_row, tile_row < m
    segment, pixel = tile_row // conv.segment, tile_row % conv.segment
    noh = segment // conv.segments_per_row
    ow = segment % conv.segments_per_row * conv.segment + pixel
    return noh * conv.out_width + ow, tvm.tirx.all(
        ow < conv.out_width, noh < conv.batch * conv.out_height)


def _elements(buf: tvm.tirx.Buffer, count: int) -> list:
    return [buf[i] for i in range(count)]


def with_params(func: tvm.tirx.PrimFunc, extra: tuple[tvm.tirx.Buffer, ...]) -> tvm.tirx.PrimFunc:
    """``func`` with the buffers its epilogue reads as parameters between B and C."""
    if not extra:
        return func
    params = list(func.params)
    return tvm.tirx.PrimFunc(params[:2] + list(extra) + params[2:], func.body, func.ret_type,
                             func.attrs)
