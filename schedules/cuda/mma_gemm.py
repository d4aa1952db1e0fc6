"""GEMMs on ``mma.sync``, written by hand in TIRx: the Ampere-style multistage kernel (sm_80 and
later), for GPUs without wgmma and for the GEMMs the wgmma kernel does not take.

``C[m, n] = epilogue(sum_k A[m, k] * B[n, k], m, n)``, both operands K-major (a torch weight's
[N, K] layout), float32 accumulation:

- one thread block per ``block_m x block_n`` tile of C (grouped along M, as the wgmma kernel's,
  so that neighbouring blocks share B's tiles in L2), ``warps_m x warps_n`` warps each owning a
  ``warp_m x warp_n`` tile of accumulators in registers;
- K in steps of 64 (128-byte rows): every thread copies 16-byte pieces of A's and B's next tiles
  with ``cp.async`` into one of ``stages`` shared-memory slots, the piece at (row, chunk) stored
  at chunk ``chunk ^ row % 8`` of its row, so that both the copies (8 threads a row) and the
  ``ldmatrix`` reads (8 rows of one chunk) touch 8 different 16-byte bank groups;
- each step is 4 slices of 16: a slice's fragments are loaded (``ldmatrix.x4``) while the
  previous slice's ``mma.sync.m16n8k16`` run, and a quarter of the next step's copies is issued
  in every slice, so the copies' address math and issue are spread between the mmas rather
  than bunched at the top of the step, where the TVM-scheduled kernel (``matmul.py``) stalls
  on them;
- the accumulators are staged in the freed pipeline slots, then each thread applies the
  epilogue to 8 consecutive columns and stores them as one 16-byte vector, as the wgmma kernel.

Sizes need not be multiples of the tile: the copies past M, N or K read nothing and fill zeros
(``cp.async``'s source size 0), and the stores skip rows and columns outside C. K must be a
multiple of 8 (16-byte pieces).

The default tile (128 x 256, 8 warps of 64 x 64, 4 stages, copies issued before a slice's
fragment loads) is the fastest of those tried at 4096^3 fp16; fewer stages, 256 x 128 blocks, two
128 x 128 blocks an SM, the K loop unrolled by the stages (four times the instructions: the
instruction cache) and the copies issued later in a slice were slower.
``python3 benchmarks/cuda_gemm.py --tiles mk,mk2x4x64x64x3,mk2x2x64x64x4x0x2`` measures the tiles
against torch.matmul.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
from tvm.script import tirx as T

from tvmfuse.targets import SM90_GPU, GpuFacts

from .wgmma import GROUP_M, Epilogue, with_params
from .wgmma_tile import STAGED_PAD

#: The name a kernel of this file reports as its implementation.
NAME = "cuda.mma_gemm"

#: Columns of K a pipeline step: 64 halves, one 128-byte row of 8 pieces of 16 bytes.
BLOCK_K = 64
PIECES = BLOCK_K // 8
#: K of one mma.sync (m16n8k16) and the slices of a step.
SLICE_K = 16
SLICES = BLOCK_K // SLICE_K
WARP = 32


@dataclass(frozen=True)
class MmaGemmTile:
    """``warps_m x warps_n`` warps of ``warp_m x warp_n`` accumulators each (multiples of 16);
    ``stages`` slots of 64 columns of K in flight."""

    warps_m: int = 2
    warps_n: int = 4
    warp_m: int = 64
    warp_n: int = 64
    stages: int = 4
    #: Where in a slice its share of the next step's copies is issued: before the next
    #: slice's fragment loads (0), between them and the mmas (1), after the mmas (2).
    copy_at: int = 0
    #: The blocks an SM must hold at once (``__launch_bounds__``: registers capped to fit).
    blocks_per_sm: int = 1

    @property
    def block_m(self) -> int:
        return self.warps_m * self.warp_m

    @property
    def block_n(self) -> int:
        return self.warps_n * self.warp_n

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * WARP

    def shared_bytes(self) -> int:
        """The pipeline's slots; the float32 accumulators are staged in the same memory."""
        pipeline = self.stages * (self.block_m + self.block_n) * BLOCK_K * 2
        return max(pipeline, self.block_m * (self.block_n + STAGED_PAD) * 4)

    def validate(self, gpu: GpuFacts = SM90_GPU) -> None:
        """Raise ``ValueError`` where the kernel cannot take the tile or it does not fit
        ``gpu``."""
        if self.warp_m % 16 or self.warp_n % 16:
            raise ValueError(f"{self}: a warp's tile must be multiples of 16")
        # each thread's copies keep one piece column and rows 8 apart (its swizzle is fixed)
        if self.threads % 64 or (self.block_m * PIECES) % self.threads \
                or (self.block_n * PIECES) % self.threads:
            raise ValueError(f"{self}: the copies must divide evenly among the threads")
        if self.stages < 3:
            raise ValueError(f"{self}: at least 3 stages (the slot written is not the one read)")
        if self.shared_bytes() * self.blocks_per_sm > gpu.shared_memory_per_block:
            raise ValueError(f"{self} needs {self.shared_bytes()} bytes of shared memory "
                             f"a block, {self.blocks_per_sm} blocks an SM")


def choose_tile(m: int, n: int, k: int, gpu: GpuFacts = SM90_GPU) -> MmaGemmTile | None:
    """This kernel's tile for an ``m x n`` GEMM summed over ``k``, or None where the
    TVM-scheduled kernel (``matmul.py``) should keep it: the block size that kernel's
    :func:`~matmul.choose_tile` picks (the one filling the SMs best), here as 4 warps of a
    quarter of it each and 4 stages, a 128 x 128 block over 256 columns or more as 128 x 256
    (8 warps of 64 x 64); None where that block is narrower than 64 rows or columns.

    On the same block this kernel is the faster of the two (its copies spread between the
    mmas, its epilogue stored 16 bytes a thread: BERT's batch-1 QKV and FFN1 on 64 x 64, ViT's
    FFN1 on 128 x 64); where ``matmul.py`` picks blocks 32 wide (BERT's N = 768 at 128 rows, a
    classifier over 49 rows) this kernel's 64-wide ones fill fewer SMs and are slower, hence
    None. Compared by
    ``python3 benchmarks/cuda_gemm.py --tiles auto,mk --shapes '128,2304,768;197,3072,768'``."""
    from .matmul import choose_tile as tvm_scheduled_tile  # noqa: PLC0415

    block = tvm_scheduled_tile(1, m, n, k, gpu)
    if block.block_m < 64 or block.block_n < 64:
        return None
    if (block.block_m, block.block_n) == (128, 128) and n >= 256:
        return MmaGemmTile()
    return MmaGemmTile(2, 2, block.block_m // 2, block.block_n // 2, 4)


def gemm_kernel(m: int, n: int, k: int, tile: MmaGemmTile | None = None,
                out_dtype: str = "float16", in_dtype: str = "float16",
                epilogue: Epilogue | None = None,
                extra: tuple[tvm.tirx.Buffer, ...] = (),
                a_shape: tuple | None = None, b_shape: tuple | None = None,
                c_shape: tuple | None = None, conv=None,
                row_views: dict | None = None,  # noqa: ARG001
                gpu: GpuFacts = SM90_GPU) -> tvm.tirx.PrimFunc:
    """The TIRx PrimFunc ``(A [m, k], B [n, k], *extra, C [m, n])``: ``epilogue(acc, row, col)``
    gives the value stored at C[row, col] (by default the accumulator cast to ``out_dtype``),
    reading the buffers ``extra``, which become parameters; ``a_shape``, ``b_shape`` and
    ``c_shape`` declare the operands with leading axes, as :func:`wgmma.gemm_kernel`'s (whose
    arguments these are, so that ``GemmMatch.kernel`` builds either). No implicit-GEMM convs
    (``conv``); ``row_views`` are left unset: the epilogue reads its buffers by their own
    index."""
    if conv is not None:
        raise ValueError("the mma.sync kernel computes GEMMs only, not implicit-GEMM convs")
    tile = tile or MmaGemmTile()
    tile.validate(gpu)
    if k % 8:
        raise ValueError(f"K = {k}: the copies need K a multiple of 8 (16-byte pieces)")
    bm, bn, stages, threads = tile.block_m, tile.block_n, tile.stages, tile.threads
    tiles_m, tiles_n = math.ceil(m / bm), math.ceil(n / bn)
    group = GROUP_M * tiles_n
    k_steps = math.ceil(k / BLOCK_K)
    frag_m, frag_n = tile.warp_m // 16, tile.warp_n // 8  # m16 fragments, n8 fragments
    rows_per_pass = threads // PIECES  # rows one pass of the block's copies covers
    a_passes, b_passes = bm // rows_per_pass, bn // rows_per_pass
    # a step's copies (A's passes, then B's), `share` of them issued in each of its slices
    copies = a_passes + b_passes
    share = -(-copies // SLICES)
    ab = {"float16": "f16", "bfloat16": "bf16"}[in_dtype]
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{ab}.{ab}.f32"
    vec = 8 if n % 8 == 0 else 1
    if epilogue is None:
        def epilogue(acc, row, col):  # noqa: ARG001
            return T.Cast(out_dtype, acc)

    # fmt: off
    @T.prim_func(check_well_formed=False)  # the epilogue's buffers are added as parameters below
    def kernel(a_handle: T.handle, b_handle: T.handle, c_handle: T.handle):
        A_param = T.match_buffer(a_handle, a_shape or (m, k), in_dtype, align=16)
        B_param = T.match_buffer(b_handle, b_shape or (n, k), in_dtype, align=16)
        C_param = T.match_buffer(c_handle, c_shape or (m, n), out_dtype, align=16)
        A = T.decl_buffer((m, k), in_dtype, data=A_param.data)
        B = T.decl_buffer((n, k), in_dtype, data=B_param.data)
        C = T.decl_buffer((m, n), out_dtype, data=C_param.data)
        T.device_entry()
        if tile.blocks_per_sm > 1:
            T.attr({"tirx.launch_bounds_min_blocks_per_sm": tile.blocks_per_sm})
        bid = T.cta_id([tiles_m * tiles_n])
        tid = T.thread_id([threads])

        arena = T.alloc_buffer((tile.shared_bytes() // 2,), in_dtype, scope="shared.dyn",
                               align=1024)
        # the slots as flat arrays: element (slot, row, col) at (slot * rows + row) * 64 + col,
        # col's piece swizzled
        a_smem = T.decl_buffer((stages * bm * BLOCK_K,), in_dtype, data=arena.data,
                               scope="shared.dyn")
        b_smem = T.decl_buffer((stages * bn * BLOCK_K,), in_dtype, data=arena.data,
                               elem_offset=stages * bm * BLOCK_K, scope="shared.dyn")
        staged = T.decl_buffer((bm, bn + STAGED_PAD), "float32", data=arena.data,
                               scope="shared.dyn")
        acc = T.alloc_local((frag_m * frag_n * 4,), "float32")
        fa = T.alloc_local((2 * frag_m * 4,), "uint32")
        fb = T.alloc_local((2 * frag_n * 2,), "uint32")
        out = T.alloc_local((vec,), out_dtype)

        first_m = T.meta_var(bid // group * GROUP_M)
        group_m = T.meta_var(T.min(tiles_m - first_m, GROUP_M))
        tile_m = T.meta_var(first_m + bid % group % group_m)
        tile_n = T.meta_var(bid % group // group_m)
        warp = T.meta_var(tid // WARP)
        lane = T.meta_var(tid % WARP)
        warp_row = T.meta_var(warp // tile.warps_n * tile.warp_m)
        warp_col = T.meta_var(warp % tile.warps_n * tile.warp_n)
        # this thread's copies: piece `piece` of rows `copy_row + pass * rows_per_pass`, all
        # with the same row % 8, so stored at piece `piece ^ copy_row % 8`
        piece = T.meta_var(tid % PIECES)
        copy_row = T.meta_var(tid // PIECES)
        stored_piece = T.meta_var(piece ^ copy_row % 8)

        @T.inline
        def copy(index, kt):
            # copy `index` of step kt: A's pass `index`, then B's passes
            slot = T.meta_var(kt % stages)
            col = T.meta_var(kt * BLOCK_K + piece * 8)
            if index < a_passes:
                row = T.meta_var(copy_row + index * rows_per_pass)
                T.ptx["cp.async.cg.shared.global"](
                    a_smem.ptr_to([(slot * bm + row) * BLOCK_K + stored_piece * 8]),
                    A.ptr_to([tile_m * bm + row, col]), 16,
                    T.Select(tile_m * bm + row < m and col < k, T.uint32(16), T.uint32(0)))
            else:
                row = T.meta_var(copy_row + (index - a_passes) * rows_per_pass)
                T.ptx["cp.async.cg.shared.global"](
                    b_smem.ptr_to([(slot * bn + row) * BLOCK_K + stored_piece * 8]),
                    B.ptr_to([tile_n * bn + row, col]), 16,
                    T.Select(tile_n * bn + row < n and col < k, T.uint32(16), T.uint32(0)))

        @T.inline
        def load_fragments(buf, kt, kk):
            slot = T.meta_var(kt % stages)
            # A's fragment i: rows warp_row + 16 i + lane % 16, piece 2 kk + lane // 16
            for i in T.unroll(frag_m):
                T.ptx["ldmatrix.sync.aligned.m8n8.x4.shared.b16"](
                    fa[(buf * frag_m + i) * 4], fa[(buf * frag_m + i) * 4 + 1],
                    fa[(buf * frag_m + i) * 4 + 2], fa[(buf * frag_m + i) * 4 + 3],
                    a_smem.ptr_to([(slot * bm + warp_row + i * 16 + lane % 16) * BLOCK_K
                                   + ((kk * 2 + lane // 16) ^ lane % 8) * 8]))
            # B's n8 fragments 2 j and 2 j + 1: rows warp_col + 16 j + lane % 8 + 8 (lane // 16),
            # piece 2 kk + lane // 8 % 2
            for j in T.unroll(frag_n // 2):
                T.ptx["ldmatrix.sync.aligned.m8n8.x4.shared.b16"](
                    fb[(buf * frag_n + j * 2) * 2], fb[(buf * frag_n + j * 2) * 2 + 1],
                    fb[(buf * frag_n + j * 2) * 2 + 2], fb[(buf * frag_n + j * 2) * 2 + 3],
                    b_smem.ptr_to([(slot * bn + warp_col + j * 16 + lane % 8 + lane // 16 * 8)
                                   * BLOCK_K + ((kk * 2 + lane // 8 % 2) ^ lane % 8) * 8]))

        @T.inline
        def mmas(buf):
            for i in T.unroll(frag_m):
                for j in T.unroll(frag_n):
                    T.ptx[mma](
                        acc[(i * frag_n + j) * 4], acc[(i * frag_n + j) * 4 + 1],
                        acc[(i * frag_n + j) * 4 + 2], acc[(i * frag_n + j) * 4 + 3],
                        fa[(buf * frag_m + i) * 4], fa[(buf * frag_m + i) * 4 + 1],
                        fa[(buf * frag_m + i) * 4 + 2], fa[(buf * frag_m + i) * 4 + 3],
                        fb[(buf * frag_n + j) * 2], fb[(buf * frag_n + j) * 2 + 1],
                        acc[(i * frag_n + j) * 4], acc[(i * frag_n + j) * 4 + 1],
                        acc[(i * frag_n + j) * 4 + 2], acc[(i * frag_n + j) * 4 + 3])

        @T.inline
        def copy_share(kk, kt):
            if kt + stages - 1 < k_steps:
                for c in T.unroll(share):
                    if kk * share + c < copies:
                        copy(kk * share + c, kt + stages - 1)

        for e in T.unroll(frag_m * frag_n * 4):
            acc[e] = T.float32(0)
        # the first stages - 1 steps in flight (a group a step, empty past K)
        for s in T.unroll(stages - 1):
            if s < k_steps:
                for c in T.unroll(copies):
                    copy(c, s)
            T.ptx["cp.async.commit_group"]()
        T.ptx["cp.async.wait_group"](stages - 2)
        T.cuda.cta_sync()
        load_fragments(0, 0, 0)
        for kt in T.serial(k_steps):
            for kk in T.unroll(SLICES):
                # a share of step kt + stages - 1's copies, into the slot step kt - 1 read
                # (every warp is past it: the barrier below, in step kt - 1)
                if tile.copy_at == 0:
                    copy_share(kk, kt)
                if kk < SLICES - 1:
                    load_fragments((kk + 1) % 2, kt, kk + 1)
                    if tile.copy_at == 1:
                        copy_share(kk, kt)
                    mmas(kk % 2)
                    if tile.copy_at == 2:
                        copy_share(kk, kt)
                else:
                    if tile.copy_at != 0:
                        copy_share(kk, kt)
                    # step kt + 1 landed (its group and all before it) and every warp is
                    # done with step kt's slot (its last slice's fragments are loaded)
                    T.ptx["cp.async.commit_group"]()
                    T.ptx["cp.async.wait_group"](stages - 2)
                    T.cuda.cta_sync()
                    if kt + 1 < k_steps:
                        load_fragments(0, kt + 1, 0)
                    mmas(kk % 2)
        T.ptx["cp.async.wait_group"](0)
        T.cuda.cta_sync()

        # the accumulators through shared memory (the pipeline's slots), then the epilogue
        # on `vec` consecutive columns a thread, stored as one vector.
        # Accumulator (i, j, e): row warp_row + 16 i + lane / 4 (+ 8 for e >= 2),
        # column warp_col + 8 j + 2 (lane % 4) (+ 1 for odd e)
        for i in T.unroll(frag_m):
            for j in T.unroll(frag_n):
                for e in T.unroll(4):
                    staged[warp_row + i * 16 + lane // 4 + e // 2 * 8,
                           warp_col + j * 8 + lane % 4 * 2 + e % 2] = acc[(i * frag_n + j) * 4 + e]
        T.cuda.cta_sync()
        for it in T.unroll(bm * bn // vec // threads):
            r = T.meta_var((it * threads + tid) // (bn // vec))
            c = T.meta_var((it * threads + tid) % (bn // vec) * vec)
            row = T.meta_var(tile_m * bm + r)
            col = T.meta_var(tile_n * bn + c)
            if row < m and col + vec <= n:
                for e in T.unroll(vec):
                    out[e] = epilogue(staged[r, c + e], row, col + e)
                for e in T.vectorized(vec):
                    C[row, col + e] = out[e]
            elif row < m:
                for e in T.serial(vec):
                    if col + e < n:
                        C[row, col + e] = epilogue(staged[r, c + e], row, col + e)
    # fmt: on
    return with_params(kernel, extra)
