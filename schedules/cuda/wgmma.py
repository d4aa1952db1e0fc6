"""GEMMs on Hopper's ``wgmma``: a warp-specialized TIRx kernel fed by TMA through an mbarrier
pipeline, for the large fp16 GEMMs where ``mma.sync`` (``matmul.py``) stops at about half of what
the H200's tensor cores give cuBLAS.

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

#: Columns of K a pipeline slot holds: 64 halves are one 128-byte swizzle row.
BLOCK_K = 64
#: wgmma's M per warpgroup and its K per instruction.
WG_M = 16 * 4
WG_K = 16
#: Threads of a warpgroup.
WG_THREADS = 128
#: M tiles grouped together in the launch order (L2 reuse of B's tiles).
GROUP_M = 8
#: TMA's swizzle mode and the wgmma descriptor's for 128-byte rows (CU_TENSOR_MAP_SWIZZLE_128B).
SWIZZLE_128B = 3
#: The descriptor's stride between 8-row groups, in 16-byte units: 8 rows of 128 bytes.
SWIZZLE_ATOM_STRIDE = 8 * 128 // 16
#: The register file of an SM, and the most registers a thread may have.
REGISTER_FILE = 65536
MAX_REGISTERS = 232
#: Registers a consumer thread needs beyond its accumulators (ptxas, sm_90a, session 26).
ACCUMULATOR_OVERHEAD = 26
#: Floats of padding a staged accumulator row: rows 8 banks apart, not 32 (all in one bank).
STAGED_PAD = 8
#: Shared memory a block may use on sm_90 (227 KiB), less the barriers.
SHARED_BYTES = 227 * 1024 - 1024


@dataclass(frozen=True)
class WgmmaTile:
    """A thread block's tile: ``consumers`` warpgroups of 64 rows each, ``block_n`` columns
    (a multiple of 16 up to 256: wgmma's N), ``stages`` pipeline slots of 64 columns of K."""

    block_n: int = 256
    stages: int = 4
    consumers: int = 2
    #: Blocks an SM runs at once: two overlap one block's epilogue and pipeline start with the
    #: other's main loop, in half the registers and shared memory each.
    blocks_per_sm: int = 1

    @property
    def block_m(self) -> int:
        return self.consumers * WG_M

    def shared_bytes(self) -> int:
        """The pipeline's slots; the float32 accumulators are staged in the same memory."""
        pipeline = self.stages * (self.block_m + self.block_n) * BLOCK_K * 2
        return max(pipeline, self.block_m * (self.block_n + STAGED_PAD) * 4)

    def registers(self) -> tuple[int, int]:
        """Registers a (consumer, producer) thread holds after ``setmaxnreg``: the block's
        share of the register file, the producer's 128 threads kept to few (one issues copies)."""
        producer = 40
        share = REGISTER_FILE // self.blocks_per_sm - WG_THREADS * producer
        return min(MAX_REGISTERS, share // (WG_THREADS * self.consumers) // 8 * 8), producer

    def validate(self) -> None:
        if self.block_n % 16 or not 16 <= self.block_n <= 256:
            raise ValueError(f"block_n {self.block_n}: wgmma takes N a multiple of 16 up to 256")
        if self.blocks_per_sm not in (1, 2):
            raise ValueError(f"{self.blocks_per_sm} blocks an SM: one or two")
        if self.shared_bytes() * self.blocks_per_sm > SHARED_BYTES:
            raise ValueError(f"{self} needs {self.shared_bytes()} bytes of shared memory")
        # two blocks an SM: the launch bound caps every thread at its share of the file before
        # setmaxnreg moves registers, and a consumer holds its accumulators and about
        # ACCUMULATOR_OVERHEAD more (ptxas asked 154 for 256 columns, 128 accumulators)
        cap = REGISTER_FILE // (self.blocks_per_sm * (self.consumers + 1) * WG_THREADS)
        if self.blocks_per_sm > 1 and self.block_n // 2 + ACCUMULATOR_OVERHEAD > cap:
            raise ValueError(f"{self} needs about {self.block_n // 2 + ACCUMULATOR_OVERHEAD} "
                             f"registers a thread where two blocks an SM allow {cap}")


#: ``epilogue(acc, row, col) -> value``: the accumulator (float32) at C[row, col] to the value
#: stored; the buffers it reads (a bias, a residual) become the kernel's parameters.
Epilogue = Callable[["tvm.ir.PrimExpr", "tvm.ir.PrimExpr", "tvm.ir.PrimExpr"], "tvm.ir.PrimExpr"]


#: Buffers of C's size an epilogue may read through an [m, n] view (see :func:`gemm_kernel`).
ROW_VIEWS = 2

#: Thread blocks a cluster may hold (portable size): a row normalization spans at most this many
#: column tiles.
MAX_CLUSTER = 8
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

#: A reduction of at most this many pipeline steps (64 of K each) is shallow: see
#: :func:`choose_wgmma_tile`.
SHALLOW_STEPS = 4


def choose_wgmma_tile(m: int, n: int, sms: int = 132, conv: bool = False,
                      k_steps: int | None = None) -> WgmmaTile:
    """The tile with the most useful work per SM-wave: blocks that fill the last wave, columns
    that are not past N (a 1x1 conv to 64 channels on 256-column tiles would waste 3/4);
    wider N first where two are within 5%.

    Two blocks an SM of one consumer each instead, twice the copies in flight and one block's
    epilogue and pipeline start overlapping the other's main loop (H200,
    ``benchmarks/cuda_conv.py``, sessions 20-21):

    - a conv whose best tile is 64 columns wide: the 3x3 conv 512 -> 512 on 7x7 at batch 32
      (72 steps of K, 112 blocks) 135 -> 190 TFLOP/s, on 56x56 x 64 (9 steps) level at 238;
      where the best tile is wider, the two-block one (64 columns) was the slower: 14x14 x 256
      396 -> 249, 28x28 x 128 376 -> 241;
    - a shallow reduction (``k_steps`` up to :data:`SHALLOW_STEPS`), at most 128 columns wide:
      ResNet-50's 1x1 convs at batch 32, 28x28 128 -> 512 (2 steps) 128 -> 158 TFLOP/s,
      56x56 256 -> 64 (4 steps) 127 -> 141, 14x14 256 -> 1024 (4 steps) level at 200; only at
      one step (56x56 64 -> 256) the two-consumer 256-column tile was ahead, 88 -> 83."""
    best = None
    for block_n in (256, 192, 128, 64):
        tile = WgmmaTile(block_n=block_n)
        tiles_n = math.ceil(n / block_n)
        blocks = math.ceil(m / tile.block_m) * tiles_n
        score = blocks / (math.ceil(blocks / sms) * sms) * n / (tiles_n * block_n)
        if best is None or score > best[0] * 1.05:
            best = (score, tile)
    if conv and best[1].block_n == 64 or k_steps is not None and k_steps <= SHALLOW_STEPS:
        return WgmmaTile(block_n=min(best[1].block_n, 128), consumers=1, blocks_per_sm=2)
    return best[1]


@dataclass(frozen=True)
class ConvGeometry:
    """An NHWC conv with an OHWI weight as the kernel's GEMM (an implicit GEMM): its rows are the
    output pixels, K runs over the window's taps and, within a tap, 64 input channels a
    pipeline step. A's tile for one step is the input under ``block_m`` output pixels shifted
    by the tap: ``segment`` pixels of one output row a TMA copy (4-D, strided by the conv's
    stride, zeros where the window hangs over the input's edge: the conv's padding), so the
    im2col matrix is never stored. Rows of a tile past an output row's end are computed from
    zeros and not stored."""

    batch: int
    height: int
    width: int
    channels: int
    out_height: int
    out_width: int
    window: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    #: zeros above and left of the input
    padding: tuple[int, int] = (0, 0)

    @property
    def segment(self) -> int:
        """Output pixels a copy loads: the width wasting the fewest rows at the end of an
        output row (56 -> 8, 28 -> 32, 14 -> 16, 7 -> 8), the wider where two waste as few."""
        return min((8, 16, 32, 64), key=lambda seg: (-(-self.out_width // seg) * seg, -seg))

    @property
    def segments_per_row(self) -> int:
        return -(-self.out_width // self.segment)

    @property
    def rows(self) -> int:
        """The GEMM's rows with each output row padded to whole segments."""
        return self.batch * self.out_height * self.segments_per_row * self.segment

    @property
    def channel_steps(self) -> int:
        return -(-self.channels // BLOCK_K)

    @property
    def k_steps(self) -> int:
        return self.window[0] * self.window[1] * self.channel_steps


def gemm_kernel(m: int, n: int, k: int, tile: WgmmaTile | None = None,
                out_dtype: str = "float16", in_dtype: str = "float16",
                epilogue: Epilogue | None = None,
                extra: tuple[tvm.tirx.Buffer, ...] = (),
                a_shape: tuple | None = None, b_shape: tuple | None = None,
                c_shape: tuple | None = None,
                conv: ConvGeometry | None = None,
                row_views: dict | None = None,
                row_norm: RowNorm | None = None) -> tvm.tirx.PrimFunc:
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
    kernel normalizes before the store: the column tiles of a row are one cluster's blocks."""
    rows = conv.rows if conv else m  # a conv's output rows padded to whole segments
    k_steps = conv.k_steps if conv else math.ceil(k / BLOCK_K)
    tile = tile or choose_wgmma_tile(rows, n, conv=conv is not None, k_steps=k_steps)
    tile.validate()
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
    consumer_registers, producer_registers = tile.registers()
    # producer threads issuing copies: a conv's segments one a thread (their copies may land
    # before thread 0's expect_tx: the barrier's count of bytes goes below zero until then)
    copiers = bm // seg if conv else 1
    taps = conv.window[0] * conv.window[1] if conv else 0
    a_stage, b_stage = bm * BLOCK_K, bn * BLOCK_K
    stage_bytes = (a_stage + b_stage) * 2
    ab = {"float16": "f16", "bfloat16": "bf16"}[in_dtype]
    mma = f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{ab}.{ab}"
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
        if tiles_n > MAX_CLUSTER:
            raise ValueError(f"N = {n} in {tiles_n} tiles of {bn}: a normalized row spans at "
                             f"most {MAX_CLUSTER} (a cluster)")

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
                        T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"](  # noqa: E501
                            a_smem.ptr_to([s, 0, 0]), T.address_of(a_map), kt * BLOCK_K,
                            tile_m * bm, T.address_of(full[s]))
                        T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"](  # noqa: E501
                            b_smem.ptr_to([s, 0, 0]), T.address_of(b_map), kt * BLOCK_K,
                            tile_n * bn, T.address_of(full[s]))
                    else:
                        # step kt: 64 channels from c0 of tap (ty, tx); thread `tid` copies
                        # segment tid of the tile, output row `noh` (image * OH + oh) from
                        # pixel `ow` (a thread a copy: one thread computing 16 segments'
                        # coordinates a step held the 3x3 conv on 56x56 to 100 TFLOP/s)
                        tap = T.meta_var(kt // conv.channel_steps)
                        c0 = T.meta_var(kt % conv.channel_steps * BLOCK_K)
                        ty = T.meta_var(tap // conv.window[1])
                        tx = T.meta_var(tap % conv.window[1])
                        segment = T.meta_var(tile_m * (bm // seg) + tid)
                        noh = T.meta_var(segment // conv.segments_per_row)
                        ow = T.meta_var(segment % conv.segments_per_row * seg)
                        T.ptx["cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"](  # noqa: E501
                            a_smem.ptr_to([s, tid * seg, 0]), T.address_of(a_map), c0,
                            ow * conv.stride[1] + tx * conv.dilation[1] - conv.padding[1],
                            noh % conv.out_height * conv.stride[0]
                            + ty * conv.dilation[0] - conv.padding[0],
                            noh // conv.out_height, T.address_of(full[s]))
                        if tid == 0:
                            T.ptx["cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"](  # noqa: E501
                                b_smem.ptr_to([s, 0, 0]), T.address_of(b_map), c0, tap,
                                tile_n * bn, T.address_of(full[s]))
            # every thread of a cluster arrives at its barriers: the consumers' sums take one
            # each, and one more keeps each block's partial sums until its peers have read them
            for _ in T.unroll(len(norm_terms) + 1 if row_norm is not None else 0):
                _cluster_barrier()
        else:
            T.ptx["setmaxnreg.inc.sync.aligned.u32"](consumer_registers)
            acc = T.alloc_local((acc_len,), "float32")
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
                        T.address_of(desc_a), a_smem.ptr_to([s, (wg - 1) * WG_M, kk * WG_K]),
                        1, SWIZZLE_ATOM_STRIDE, SWIZZLE_128B)
                    T.cuda.wgmma.encode_matrix_descriptor(
                        T.address_of(desc_b), b_smem.ptr_to([s, 0, kk * WG_K]),
                        1, SWIZZLE_ATOM_STRIDE, SWIZZLE_128B)
                    T.ptx[mma](*_elements(acc, acc_len), desc_a, desc_b, T.bool(True),
                               1, 1, 0, 0)
                T.ptx.wgmma.commit_group.sync.aligned()
                # the group before this one has read its slot: hand that slot back
                T.ptx.wgmma.wait_group.sync.aligned(1)
                if kt > 0:
                    T.ptx.mbarrier.arrive.shared.b64(T.address_of(empty[(kt + stages - 1) % stages]))
            T.ptx.wgmma.wait_group.sync.aligned(0)

            # The accumulators go through shared memory (the pipeline's slots, free once both
            # consumers have passed their last wgmma) so that each thread then applies the
            # epilogue to `vec` consecutive columns and stores them as one vector: stored from
            # the fragments, four threads would write 16 bytes of a row, 2 bytes at a time.
            # Accumulator j*4 + e of a thread: row 16 * warp + lane / 4 (+ 8 for e >= 2),
            # column 8 * j + 2 * (lane % 4) (+ 1 for odd e).
            T.ptx.bar.sync(T.uint32(1), T.uint32(consumers * WG_THREADS))
            wg_row = T.meta_var((wg - 1) * WG_M)
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
    return _with_params(kernel, extra)


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


def _with_params(func: tvm.tirx.PrimFunc, extra: tuple[tvm.tirx.Buffer, ...]) -> tvm.tirx.PrimFunc:
    """``func`` with the buffers its epilogue reads as parameters between B and C."""
    if not extra:
        return func
    params = list(func.params)
    return tvm.tirx.PrimFunc(params[:2] + list(extra) + params[2:], func.body, func.ret_type,
                             func.attrs)


#: The name a kernel of this file reports as its implementation.
NAME = "cuda.wgmma_gemm"


@dataclass(frozen=True)
class GemmMatch:
    """A fused kernel the wgmma kernel computes: ``out = epilogue(A @ B)`` with A [..., M', K]
    (rows: the leading axes), B [K, N] (``b_kn``, a legalized linear layer's weight, which the
    kernel reads transposed) or [N, K], and an elementwise epilogue."""

    func: tvm.tirx.PrimFunc
    a: tvm.tirx.Buffer
    b: tvm.tirx.Buffer
    out: tvm.tirx.Buffer
    m: int
    n: int
    k: int
    b_kn: bool
    #: The output block's iterators (rows..., column), its stored value, and the matmul's
    #: buffer that value reads (the accumulator, in the kernel).
    iters: tuple
    value: object
    accumulator: tvm.tirx.Buffer
    #: Set where the kernel is an NHWC conv (A its input, B its OHWI weight) with a window
    #: or strides: the kernel computes it as an implicit GEMM.
    conv: ConvGeometry | None = None
    #: Set where the kernel normalizes its output rows (``row_norm.RowNormMatch``): the
    #: epilogue above then computes the row element, not the stored value.
    row_norm: object = None

    @property
    def b_index(self) -> int:
        """B's position among the kernel's parameters."""
        return [p.same_as(self.b) for p in self.func.params].index(True)

    def kernel(self, tile=None, build: Callable | None = None) -> tvm.tirx.PrimFunc:
        """The TIRx kernel, its parameters in the fused kernel's order (B now [N, K]);
        ``build`` writes it (by default this file's :func:`gemm_kernel` with ``tile``, a
        :class:`WgmmaTile`; ``mma_gemm.gemm_kernel`` with a ``MmaGemmTile`` takes the same
        arguments)."""
        extents = [int(d) for d in self.out.shape[:-1]]
        # the epilogue's other buffers declared anew, as TIRx declares buffers (those of the
        # s_tir kernel have no layout, which TIRx's FlattenBuffer cannot place)
        extra = tuple(p for p in self.func.params
                      if not any(p.same_as(x) for x in (self.a, self.b, self.out)))
        # A 0-d one (a clip's bound: MobileNetV2's ReLU6 in fp16) as one element: TIRx's
        # FlattenBuffer does not place 0-d parameters ("used before its definition"); the
        # calls pass it reshaped (``passes.use_wgmma_gemms``)
        fresh = [(old, tvm.tirx.decl_buffer([int(d) for d in old.shape] or [1], old.dtype,
                                            old.name)) for old in extra]
        # a buffer shaped as the output (a residual) read where the output is stored: read as
        # [rows, columns], its element at (row, col), not through row's position in each
        # leading axis (64-bit divisions by 196 and 14 in every element's address: ResNet-50's
        # residual 1x1 convs ran at a third of their memory roofline)
        shape = [int(d) for d in self.out.shape]
        views = {new: None for old, new in fresh
                 if [int(d) for d in old.shape] == shape and len(shape) > 2}
        views = dict(list(views.items())[:ROW_VIEWS])

        def bind(iters, row, col) -> dict:
            """The values of a block's ``iters`` (rows..., column) at C[row, col]."""
            index = []
            for extent in reversed(extents):
                index.append(row % extent)
                row = row // extent
            return {var: T.Cast(var.ty, value)
                    for var, value in zip(iters, [*reversed(index), col])}

        def epilogue(acc, row, col):
            flat_row, bound = row, bind(self.iters, row, col)

            def on_load(load):
                if load.source.same_as(self.accumulator):
                    return acc
                new = next(new for old, new in fresh if old.same_as(load.source))
                if views.get(new) is not None and _is_identity(load.indices, self.iters):
                    return views[new](flat_row, col)
                return None

            return _rebuild(self.value, on_load, bound, fresh)

        norm = {} if self.row_norm is None else {
            "row_norm": self.row_norm.row_norm(bind, fresh)}
        func = (build or gemm_kernel)(self.m, self.n, self.k, tile, out_dtype=str(self.out.dtype),
                           in_dtype=str(self.a.dtype), epilogue=epilogue,
                           extra=tuple(new for _, new in fresh),
                           a_shape=tuple(int(d) for d in self.a.shape),
                           b_shape=None if self.b_kn else tuple(int(d) for d in self.b.shape),
                           c_shape=tuple(int(d) for d in self.out.shape), conv=self.conv,
                           row_views=views, **norm)
        a, b, *_, c = func.params
        params = [a if p.same_as(self.a) else b if p.same_as(self.b) else c
                  if p.same_as(self.out) else next(new for old, new in fresh if old.same_as(p))
                  for p in self.func.params]
        return tvm.tirx.PrimFunc(params, func.body, func.ret_type, func.attrs)


def match_gemm(func: tvm.tirx.PrimFunc, in_dtype: str = "float16") -> GemmMatch | None:
    """The GEMM ``func`` computes, if it is one the wgmma kernel takes: one matmul of
    ``in_dtype`` parameters summed in float32, rows contiguous, then elementwise blocks
    (bias, activation, residual, casts) into the last parameter; None otherwise."""
    fused = _fused_blocks(func)
    if fused is None:
        return None
    sch, matmul = fused
    found = _matmul(sch.get(matmul), func.params, in_dtype)
    if found is None:
        return None
    a, b, accumulator, spatial, b_kn = found
    m = math.prod(int(iv.dom.extent) for iv in spatial[:-1])
    n, k = int(spatial[-1].dom.extent), int(a.shape[-1])
    epilogue = _epilogue(sch, matmul, func.params[-1], accumulator, spatial)
    if epilogue is None or k % 8:
        return None
    return GemmMatch(func, a, b, func.params[-1], m, n, k, b_kn, *epilogue, accumulator)


def match_conv(func: tvm.tirx.PrimFunc, in_dtype: str = "float16") -> GemmMatch | None:
    """The conv ``func`` computes, if the wgmma kernel takes it as an implicit GEMM: an NHWC
    conv (``C[n, h, w, o] += X'[n, h * sh + ry * dh, w * sw + rx * dw, c] * W[o, ry, rx, c]``)
    of ``in_dtype`` parameters summed in float32, X' the input X or X zero-padded (a block
    ``X'[n, h, w, c] = if_then_else(inside, X[n, h - top, w - left, c], 0)``), channels a
    multiple of 8 (at least 64 where the window has several taps), strides up to 4, then an
    elementwise epilogue as :func:`match_gemm`'s."""
    fused = _fused_blocks(func, keep_producers=True)
    if fused is None:
        return None
    sch, matmul = fused
    found = _conv(sch, matmul, func.params, in_dtype)
    if found is None:
        return None
    x, weight, accumulator, spatial, geometry = found
    if not _inline_blocks(sch, matmul, func.params[-1]):  # the padding, read off above
        return None
    epilogue = _epilogue(sch, matmul, func.params[-1], accumulator, spatial)
    if epilogue is None:
        return None
    n = int(spatial[-1].dom.extent)
    return GemmMatch(func, x, weight, func.params[-1], math.prod(
        int(iv.dom.extent) for iv in spatial[:-1]), n, math.prod(int(d) for d in weight.shape[1:]),
        False, *epilogue, accumulator, conv=geometry)


def _fused_blocks(func: tvm.tirx.PrimFunc, keep_producers: bool = False):
    """``(schedule, the one reduction block)`` of ``func``, its other blocks but the last
    parameter's writer inlined (all but those feeding the reduction with ``keep_producers``);
    None where it has no or several reductions, or blocks that do not inline."""
    from tvm import s_tir  # noqa: PLC0415

    try:
        sch = s_tir.Schedule(func)
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    except Exception:  # noqa: BLE001 - a kernel written without blocks is not ours to take
        return None
    is_reduction = [_reduces(sch.get(b)) for b in blocks]
    if sum(is_reduction) != 1 or not func.params:
        return None
    matmul = blocks[is_reduction.index(True)]
    keep = {r.source for r in sch.get(matmul).reads} if keep_producers else set()
    return (sch, matmul) if _inline_blocks(sch, matmul, func.params[-1], keep) else None


def _reduces(block) -> bool:
    """``block`` has a reduction axis."""
    return any(iv.iter_type != tvm.tirx.IterVar.DataPar for iv in block.iter_vars)


def _inline_blocks(sch, matmul, out: tvm.tirx.Buffer, keep: set = frozenset()) -> bool:
    """Inline each block of ``sch`` but the reduction ``matmul``, the writer of ``out`` and
    those writing a buffer in ``keep``; False where one does not inline."""
    from tvm import s_tir  # noqa: PLC0415

    for block in list(sch.get_child_blocks(sch.get_sblock("root"))):
        writes = sch.get(block).writes
        if sch.get(block).same_as(sch.get(matmul)) or any(
                w.source.same_as(out) or w.source in keep for w in writes):
            continue
        try:
            sch.compute_inline(block)
        except s_tir.ScheduleError:
            return False
    return True


def _epilogue(sch, matmul, out: tvm.tirx.Buffer, accumulator: tvm.tirx.Buffer, spatial):
    """``(iterators, value)`` of what the kernel stores in ``out`` at each output of the
    reduction ``matmul`` (the accumulator cast, or the one elementwise block left after it,
    reading the accumulator where it stores and parameters elsewhere); None otherwise."""
    rest = [block for block in sch.get_child_blocks(sch.get_sblock("root"))
            if not sch.get(block).same_as(sch.get(matmul))]
    if accumulator.same_as(out):
        if rest:
            return None
        iters = tuple(iv.var for iv in spatial)
        value = T.Cast(str(out.dtype), tvm.tirx.BufferLoad(accumulator, list(iters)))
    else:
        if len(rest) != 1:
            return None
        stmt = sch.get(rest[0])
        store = stmt.body
        iters = tuple(iv.var for iv in stmt.iter_vars)
        if (not isinstance(store, tvm.tirx.BufferStore) or not store.buffer.same_as(out)
                or not _is_identity(store.indices, iters)
                or [int(iv.dom.extent) for iv in stmt.iter_vars]
                != [int(iv.dom.extent) for iv in spatial]):
            return None
        value = store.value
        loads = []
        try:
            _rebuild(value, loads.append, {})  # walks the value: append keeps each load
        except ValueError:
            return None
        # the accumulator read where it is stored, the rest parameters (a bias, a residual)
        params = sch.mod["main"].params
        if not loads or not all(
                _is_identity(load.indices, iters) if load.source.same_as(accumulator)
                else any(load.source.same_as(p) for p in params) for load in loads):
            return None
    if str(out.dtype) not in ("float16", "bfloat16", "float32"):
        return None
    return iters, value


def _conv(sch, block_rv, params, in_dtype: str):
    """``(X, W, C, spatial iterators, ConvGeometry)`` of the NHWC conv block (see
    :func:`match_conv`), else None."""
    block = sch.get(block_rv)
    store = block.body
    spatial = [iv for iv in block.iter_vars if iv.iter_type == tvm.tirx.IterVar.DataPar]
    reduce = [iv for iv in block.iter_vars if iv.iter_type != tvm.tirx.IterVar.DataPar]
    if (not isinstance(store, tvm.tirx.BufferStore) or len(spatial) != 4 or len(reduce) != 3
            or str(store.buffer.dtype) != "float32"
            or not _is_identity(store.indices, [iv.var for iv in spatial])
            or not isinstance(store.value, tvm.ir.prim.expr.Add)
            or not isinstance(store.value.b, tvm.ir.prim.expr.Mul)):
        return None
    loads = []
    for operand in (store.value.b.a, store.value.b.b):
        if not isinstance(operand, tvm.ir.prim.expr.Cast) or not isinstance(
                operand.value, tvm.ir.TensorLoad) or str(operand.value.source.dtype) != in_dtype:
            return None
        loads.append(operand.value)
    (b, h, w, o), (ry, rx, rc) = ([iv.var for iv in ivs] for ivs in (spatial, reduce))
    source, weight = (load.source for load in loads)
    if not any(weight.same_as(p) for p in params) or not _is_identity(
            loads[1].indices, [o, ry, rx, rc]):
        return None
    x, padding = _unpadded(sch, source, params)
    if x is None or str(x.dtype) != in_dtype:
        return None
    # X'[b, h * sh + ry * dh, w * sw + rx * dw, c]: the coefficients read off the indices
    analyzer = tvm.sym.Analyzer()
    coefficients = []
    for index, out_var, window_var in ((loads[0].indices[1], h, ry), (loads[0].indices[2], w, rx)):
        stride, dilation = (_coefficient(index, var, (b, h, w, o, ry, rx, rc))
                            for var in (out_var, window_var))
        if (None in (stride, dilation) or not 1 <= stride <= 4 or dilation < 1
                or not analyzer.can_prove_equal(index, out_var * stride + window_var * dilation)):
            return None
        coefficients.append((stride, dilation))
    if not (_is_identity([loads[0].indices[0], loads[0].indices[3]], [b, rc])):
        return None
    batch, height, width, channels = (int(d) for d in x.shape)
    if channels % 8 or [int(d) for d in weight.shape[1:]] != [
            int(iv.dom.extent) for iv in reduce] or int(weight.shape[-1]) != channels:
        return None
    # a tap's channels are one pipeline step of 64 (zeros past C): over fewer channels the
    # steps are mostly zeros, where mma.sync's steps run over taps and channels together (the
    # space-to-depth stem: 16 channels, 4x4 taps)
    if channels < BLOCK_K and int(reduce[0].dom.extent) * int(reduce[1].dom.extent) > 1:
        return None
    geometry = ConvGeometry(
        batch, height, width, channels, int(spatial[1].dom.extent), int(spatial[2].dom.extent),
        window=(int(reduce[0].dom.extent), int(reduce[1].dom.extent)),
        stride=(coefficients[0][0], coefficients[1][0]),
        dilation=(coefficients[0][1], coefficients[1][1]), padding=padding)
    return x, weight, store.buffer, spatial, geometry


def _unpadded(sch, source: tvm.tirx.Buffer, params):
    """``(X, (top, left))`` where ``source`` is the parameter X, or X zero-padded by the one
    block writing ``source`` (topi's pad: ``if_then_else(inside, X[n, h - top, w - left, c],
    0)``, ``inside`` the bounds of X, which TMA's zero fill reproduces); ``(None, None)``."""
    if any(source.same_as(p) for p in params):
        return source, (0, 0)
    writers = [blk for blk in sch.get_child_blocks(sch.get_sblock("root"))
               if any(w.source.same_as(source) for w in sch.get(blk).writes)]
    if len(writers) != 1:
        return None, None
    stmt = sch.get(writers[0])
    store, iters = stmt.body, [iv.var for iv in stmt.iter_vars]
    if not isinstance(store, tvm.tirx.BufferStore) or not _is_identity(store.indices, iters):
        return None, None
    value, inside = store.value, None
    if isinstance(value, tvm.ir.Call) and value.op.same_as(tvm.ir.Op.get("prim.if_then_else")):
        inside, value, zero = value.args
        if not isinstance(zero, tvm.tirx.FloatImm) or zero.value != 0:
            return None, None
    if not isinstance(value, tvm.ir.TensorLoad) or not any(
            value.source.same_as(p) for p in params) or len(iters) != 4:
        return None, None
    offsets = [_coefficient(index, None, iters) for index in value.indices]
    analyzer = tvm.sym.Analyzer()
    if None in offsets or offsets[0] or offsets[3] or not all(
            analyzer.can_prove_equal(index, var - offset)
            for index, var, offset in zip(value.indices, iters, (0, offsets[1], offsets[2], 0))):
        return None, None
    if inside is not None:
        # the zeros must be exactly where X is not: TMA fills zeros there and reads X elsewhere
        for iv in stmt.iter_vars:
            analyzer.bind(iv.var, tvm.ir.Range.from_min_extent(iv.dom.min, iv.dom.extent))
        (_, height, width, _), (_, h, w, _) = value.source.shape, iters
        within = tvm.tirx.all(offsets[1] <= h, h < offsets[1] + height,
                              offsets[2] <= w, w < offsets[2] + width)
        if not analyzer.can_prove(tvm.tirx.EQ(inside, within)):
            return None, None
    return value.source, (offsets[1], offsets[2])


def _coefficient(index, var, variables) -> int | None:
    """The coefficient of ``var`` in the affine ``index`` (``var`` None: minus its constant
    term), found by evaluating it with ``variables`` at 0 and ``var`` at 1; None where that is
    not a constant."""
    point = {v: tvm.tirx.const(1 if var is not None and v.same_as(var) else 0, v.ty)
             for v in variables}
    at = tvm.sym.Analyzer().simplify(_rebuild(index, lambda load: None, point))
    if not isinstance(at, tvm.tirx.IntImm):
        return None
    return int(at.value) if var is not None else -int(at.value)


def _matmul(block, params, in_dtype: str):
    """``(A, B, C, spatial iterators, B is [K, N])`` of ``C[s..., j] += f32(A[s..., k]) *
    f32(B[k, j] or B[j, k])`` with A and B parameters, else None. Reductions of extent 1 beside
    k are read as 0: a 1x1 stride-1 NHWC conv, ``C[n, h, w, o] += X[n, h + ry, w + rx, c] *
    W[o, ry, rx, c]``, is such a GEMM (W [N, 1, 1, K])."""
    store = block.body
    spatial = [iv for iv in block.iter_vars if iv.iter_type == tvm.tirx.IterVar.DataPar]
    reduce = [iv for iv in block.iter_vars if iv.iter_type != tvm.tirx.IterVar.DataPar]
    summed = [iv for iv in reduce if int(iv.dom.extent) != 1]
    if not isinstance(store, tvm.tirx.BufferStore) or len(summed) != 1 or len(spatial) < 2:
        return None
    acc, kvar = store.buffer, summed[0].var
    unit = {iv.var: tvm.tirx.const(0, iv.var.ty) for iv in reduce if int(iv.dom.extent) == 1}
    svars = [iv.var for iv in spatial]
    value = store.value
    if (str(acc.dtype) != "float32" or not _is_identity(store.indices, svars)
            or not isinstance(value, tvm.ir.prim.expr.Add)
            or not isinstance(value.b, tvm.ir.prim.expr.Mul)):
        return None
    loads = []
    for operand in (value.b.a, value.b.b):
        if not isinstance(operand, tvm.ir.prim.expr.Cast) or not isinstance(
                operand.value, tvm.ir.TensorLoad):
            return None
        loads.append(operand.value)
    a, b = (load.source for load in loads)
    if (not all(any(x.same_as(p) for p in params) for x in (a, b))
            or {str(a.dtype), str(b.dtype)} != {in_dtype}
            or [int(d) for d in a.shape[:-1]] != [int(iv.dom.extent) for iv in spatial[:-1]]):
        return None
    a_index, b_index = (_without_units(load.indices, unit) for load in loads)
    if not _is_identity(a_index, [*svars[:-1], kvar]):
        return None
    if len(b.shape) == 2 and _is_identity(b_index, [kvar, svars[-1]]):
        return a, b, acc, spatial, True
    if (_is_identity([b_index[0], b_index[-1]], [svars[-1], kvar])
            and all(int(d) == 1 for d in b.shape[1:-1])
            and all(isinstance(i, tvm.tirx.IntImm) and int(i) == 0 for i in b_index[1:-1])):
        return a, b, acc, spatial, False
    return None


def _without_units(indices, unit: dict) -> list:
    """``indices`` with the unit reductions set to 0, simplified (``h + ry`` -> ``h``)."""
    analyzer = tvm.sym.Analyzer()
    return [analyzer.simplify(_rebuild(i, lambda load: None, unit)) for i in indices]


def _is_identity(indices, variables) -> bool:
    return len(indices) == len(variables) and all(
        isinstance(i, tvm.tirx.Var) and i.same_as(v) for i, v in zip(indices, variables))


_BINARY = tuple(getattr(tvm.ir.prim.expr, name) for name in (
    "Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min", "Max",
    "EQ", "NE", "LT", "LE", "GT", "GE", "And", "Or"))


def _rebuild(expr, on_load, bound: dict, buffers=()):
    """``expr`` with variables replaced by ``bound`` and each load by ``on_load(load)`` (None:
    the load kept, its indices rebuilt, its buffer replaced where ``buffers`` pairs it (old,
    new)). The epilogues of fused kernels are casts, arithmetic, selects and math calls;
    anything else raises ``ValueError``."""
    def visit(e):
        if isinstance(e, tvm.ir.TensorLoad):
            replaced = on_load(e)
            if replaced is None:
                source = next((new for old, new in buffers if old.same_as(e.source)), e.source)
                indices = [visit(i) for i in e.indices]
                if not indices and len(source.shape) == 1:  # a 0-d buffer declared as one
                    indices = [0]
                return tvm.tirx.BufferLoad(source, indices)
            return replaced
        if isinstance(e, tvm.tirx.Var):
            return next((v for var, v in bound.items() if var.same_as(e)), e)
        if isinstance(e, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
            return e
        if isinstance(e, tvm.ir.prim.expr.Cast):
            return T.Cast(e.ty, visit(e.value))
        if isinstance(e, _BINARY):
            return type(e)(visit(e.a), visit(e.b))
        if isinstance(e, tvm.ir.prim.expr.Not):
            return type(e)(visit(e.a))
        if isinstance(e, tvm.ir.prim.expr.Select):
            return type(e)(visit(e.condition), visit(e.true_value), visit(e.false_value))
        if isinstance(e, tvm.ir.Call):
            return tvm.ir.Call(e.op, [visit(arg) for arg in e.args], ret_ty=e.ty)
        raise ValueError(f"an epilogue with {type(e).__name__} is not taken")
    return visit(expr)
