"""GEMMs and batched GEMMs on tensor cores: ``mma.sync`` m16n8k16 from ``ldmatrix``-loaded
shared memory, a multi-stage ``cp.async`` pipeline, register-blocked warp tiles, and the fused
epilogue applied on the way out.

A kernel whose one reduction is a matmul of ``in_dtype`` operands (any batch, any layout of its
operands: TVM's ``reindex`` and dlight's index maps bring it to ``C[s, i, j] += A[s, i, k] *
B[s, j, k]``) is scheduled as below. An NHWC conv with OHWI weights is such a kernel, an implicit
GEMM: i runs over the output pixels, j over the output channels, k over the window and the input
channels (C innermost, so that 8 of k are 16 contiguous bytes where C is a multiple of 8); the
im2col matrix is never stored, its padding and strides are read into the shared-memory copy.

- a thread block per ``block_m x block_n`` output tile (:class:`MmaTile`, chosen per shape by
  :func:`choose_tile`), ``warps_m x warps_n`` warps each owning ``frag_m x frag_n`` fragments of
  16 x 16 accumulators in registers;
- ``chunk_k x 16`` columns of K a step: A's and B's tiles copied to shared memory 16 bytes a
  thread with ``cp.async`` (``software_pipeline_async_stages``), ``stages`` steps in flight, rows
  padded by 8 halves so that ``ldmatrix`` reads of eight rows hit eight different banks;
- fragments loaded with ``ldmatrix`` (double-buffered against the ``mma``s), accumulated in
  ``accumulator`` precision (float32 unless the kernel itself accumulates in float16);
- the accumulators stored to shared memory, then the epilogue (bias, activation, residual,
  cast: the kernel's later blocks, inlined) applied as each thread writes 16 bytes to global.

Sizes need not be multiples of the tile: ``pad_einsum`` pads M, N and K to whole tiles in the
loads (reading zeros, ``cp.async`` with a zero-fill predicate) and the stores are predicated.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.s_tir.dlight.gpu.matmul import (
    auto_inline_consumer_chain,
    auto_inline_producers,
    get_index_map,
    get_reduction_blocks,
)

from tvmfuse.targets import SM90_GPU, GpuFacts

from ..tir_util import lanes_for, read_index_nodes, static_int, uses
from . import cp_async  # noqa: F401 - the cp.async code generator with 64-bit source offsets

#: The name a kernel of this file reports as its implementation.
NAME = "cuda.mma_matmul"

#: One mma fragment of the intrinsics used: 16 x 16 outputs, 16 of K.
FRAGMENT = 16
WARP = 32
#: Narrower N or K than this is left to other rules: an mma fragment would be mostly zeros.
MIN_EXTENT = 8
_BYTES = {"float16": 2, "bfloat16": 2, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


@dataclass(frozen=True)
class MmaTile:
    """A thread block's work: ``warps_m x warps_n`` warps, each ``frag_m x frag_n`` fragments of
    16 x 16; ``chunk_k`` fragments of K per pipeline step, ``stages`` steps in flight;
    ``blocks_per_sm``, where given, the blocks an SM must hold at once (``__launch_bounds__``'s
    second argument: ptxas fits the registers to it). The tiles below leave it unset: a third
    128 x 128 block an SM, its registers cut to fit, does not run faster than two
    (``python3 benchmarks/cuda_gemm.py --tiles 2x2x4x4x4x3,2x2x4x4x4x3x3``)."""

    warps_m: int
    warps_n: int
    frag_m: int
    frag_n: int
    chunk_k: int = 2
    stages: int = 3
    blocks_per_sm: int | None = None

    @property
    def block_m(self) -> int:
        return self.warps_m * self.frag_m * FRAGMENT

    @property
    def block_n(self) -> int:
        return self.warps_n * self.frag_n * FRAGMENT

    @property
    def block_k(self) -> int:
        return self.chunk_k * FRAGMENT

    @property
    def warps(self) -> int:
        return self.warps_m * self.warps_n

    def shared_bytes(self, in_bytes: int = 2) -> int:
        """Shared memory of the pipeline's A and B tiles (rows padded by 8 elements)."""
        row = self.block_k + 8
        return self.stages * (self.block_m + self.block_n) * row * in_bytes


#: The tiles tried, largest first: 128 x 128 with 4 warps of 64 x 64 (the per-warp tile that
#: feeds mma best), down to 32 x 32 blocks for small or batch-1 GEMMs, where a large tile would
#: leave most of the GPU's SMs idle.
TILES = (
    MmaTile(2, 2, 4, 4),
    MmaTile(2, 2, 4, 2),
    MmaTile(2, 2, 2, 4),
    MmaTile(2, 2, 2, 2),
    MmaTile(2, 2, 1, 2),
    MmaTile(2, 2, 1, 1),
)

#: Reductions at least this deep take K steps of 64 (``chunk_k`` 4), shallower ones steps of 32:
#: a longer step halves the pipeline's barriers and issues more mmas between them, which pays
#: where there are several steps; a reduction of one or two steps of 64 is better split in 32s
#: that keep the pipeline going. Measured by
#: ``python3 benchmarks/cuda_gemm.py --tiles 2x2x4x4x2x3,2x2x4x4x4x3 --no-dlight``.
DEEP_K = 256
#: Blocks that keep steps of 32 at any depth: 128 x 64 with steps of 64 needs 83 KB of shared
#: memory, so an SM holds two blocks instead of four, which slows N = 768 GEMMs (BERT's) more
#: than the longer steps gain (``--tiles 2x2x4x2x2x3,2x2x4x2x4x3`` of the command above).
SHALLOW_BLOCKS = ((128, 64),)


def choose_tile(batch: int | None, m: int | None, n: int | None, k: int | None = None,
                gpu: GpuFacts = SM90_GPU) -> MmaTile:
    """The tile for a ``batch x m x n`` output summed over ``k``: the largest block whose blocks
    fill ``gpu``'s SMs (at least one block each), scored by the share of padded work it
    leaves, with K steps of 64 where ``k`` is at least :data:`DEEP_K` (but on
    :data:`SHALLOW_BLOCKS`); symbolic sizes take the largest tile."""
    tile = _block_tile(batch, m, n, gpu.sm_count)
    deep = (k is None or k >= DEEP_K) and (tile.block_m, tile.block_n) not in SHALLOW_BLOCKS
    return dataclasses.replace(tile, chunk_k=4) if deep else tile


def _block_tile(batch: int | None, m: int | None, n: int | None, sms: int) -> MmaTile:
    if None in (batch, m, n):
        return TILES[0]

    def score(tile: MmaTile) -> float:
        blocks = batch * -(-m // tile.block_m) * -(-n // tile.block_n)
        useful = m * n / (-(-m // tile.block_m) * tile.block_m * -(-n // tile.block_n)
                          * tile.block_n)
        waves = blocks / sms
        filled = waves / math.ceil(waves)  # the last wave's idle SMs
        # larger tiles reuse each loaded element more: per-element traffic ~ 1/m + 1/n
        reuse = 1 / (1 / tile.block_m + 1 / tile.block_n) / 64
        return useful * filled * min(reuse, 1.0) ** 0.5

    return max(TILES, key=score)


class TensorCoreMatmul(GPUScheduleRule):
    """The schedule rule: takes a kernel whose one reduction is a matmul of ``in_dtype``
    operands; ``tile`` forces one tile (tests, tuning), else :func:`choose_tile` picks one for
    ``gpu``."""

    name = NAME

    def __init__(self, in_dtype: str = "float16", tile: MmaTile | None = None,
                 gpu: GpuFacts = SM90_GPU):
        self.in_dtype, self.tile, self.gpu = in_dtype, tile, gpu

    def apply(self, func: tirx.PrimFunc, target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        reductions = get_reduction_blocks(sch, blocks)
        if reductions is None or len(reductions) != 1:
            return None
        main = reductions[0]
        stmt = sch.get(main)
        if len(stmt.reads) != 2 or any(str(r.source.dtype) != self.in_dtype for r in stmt.reads):
            return None
        accumulator = str(stmt.writes[0].source.dtype)
        if accumulator not in ("float32", "float16") or get_index_map(stmt) is None:
            return None
        # B may be stored K-major (a weight as torch stores it: the trans-b intrinsics) or
        # N-major; A must be M-major, the layout the loads to shared memory take
        reduction = [iv.var for iv in stmt.iter_vars if iv.iter_type != tirx.IterVar.DataPar]
        if not any(uses(stmt.reads[0].region[-1].min, var) for var in reduction):
            return None
        trans_b = any(uses(stmt.reads[1].region[-1].min, var) for var in reduction)
        try:
            return _schedule(sch, main, trans_b, self.in_dtype, accumulator, self.tile, self.gpu)
        except (s_tir.ScheduleError, tvm.error.InternalError, AssertionError):
            return None  # a layout the intrinsics do not match (dlight's helpers assert)


def _schedule(sch: s_tir.Schedule, main, trans_b: bool, in_dtype: str, accumulator: str,
              tile: MmaTile | None, gpu: GpuFacts) -> s_tir.Schedule | None:
    # TVM registers every CUDA intrinsic when this module is imported: about a minute on 2 cores
    from tvm.s_tir.tensor_intrin.cuda import (  # noqa: PLC0415
        get_mma_intrin_group,
        shared_16x16_to_ldmatrix_32x8_layout,
    )

    # 1. C[s, i, j] += A[s, i, k] * B[s, k, j], or B[s, j, k] where K is B's contiguous axis
    #    (trans_b): the copies to shared memory read 16 contiguous bytes
    a_copy = sch.reindex(main, ("read", 0))
    b_copy = sch.reindex(main, ("read", 1))
    c_copy = sch.reindex(main, ("write", 0))
    # the maps of the reindexed block: reindex drops unit loops (a 1x1 conv's R and S), which
    # the maps of the block as it was still index
    matmul_map, a_map, b_map, c_map = get_index_map(sch.get(main))
    sch.transform_layout(a_copy, ("write", 0), a_map)
    sch.transform_layout(b_copy, ("write", 0), b_map)
    if not trans_b:
        sch.transform_layout(b_copy, ("write", 0), lambda s, j, k: (s, k, j))
    sch.transform_layout(c_copy, ("read", 0), c_map)
    sch.transform_block_layout(main, matmul_map)
    batch, m, n, k = (static_int(sch.get(loop).extent) for loop in sch.get_loops(main))
    if any(size is not None and size < MIN_EXTENT for size in (n, k)):
        return None  # a depthwise conv's one channel a group: mostly padding on tensor cores
    if tile is None:
        tile = choose_tile(batch, m, n, k, gpu)
    # 2. whole tiles: zeros read past M, N and K, outputs past M and N not stored
    sch.pad_einsum(main, [1, tile.block_m, tile.block_n, tile.block_k])

    # 3. fragments, warps, blocks
    b_loop, i, j, kk = sch.get_loops(main)
    i, i_frag = sch.split(i, [None, FRAGMENT])
    j, j_frag = sch.split(j, [None, FRAGMENT])
    kk, k_frag = sch.split(kk, [None, FRAGMENT])
    sch.reorder(i, j, kk, i_frag, j_frag, k_frag)
    inner = main
    outer = sch.blockize(i_frag)
    i0, i1, i2 = sch.split(i, [None, tile.warps_m, tile.frag_m])
    j0, j1, j2 = sch.split(j, [None, tile.warps_n, tile.frag_n])
    k0, k1 = sch.split(kk, [None, tile.chunk_k])
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
    sch.bind(b_loop, "blockIdx.z")
    sch.bind(sch.fuse(i0, j0), "blockIdx.x")
    warp = sch.fuse(i1, j1)
    sch.bind(warp, "threadIdx.y")

    # 4. global -> shared, 16 bytes a thread, pipelined
    vector = 16 // _BYTES[in_dtype]

    def to_shared(index: int):
        copy = sch.cache_read(outer, index, "shared.dyn")
        sch.compute_at(copy, k0)
        return copy

    def distribute(copy):
        # a producer inlined into the copy whose index divides by a count the vector does not
        # divide (a patch-embedding conv's NCHW input read through its permute: % 3, / 3136)
        # makes the vector's index math 8 int32 lanes, which TVM's CUDA codegen prints as
        # make_longlong4(8 values): ViT's, CLIP's and Swin's fp16 builds did not compile
        width = _aligned_lanes(sch.get(copy), _ramp_lanes(sch.get(copy), vector))
        fused = sch.fuse(*sch.get_loops(copy)[-2:])
        _, ty, tx, lanes = sch.split(fused, [None, tile.warps, WARP, width])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(lanes)
        sch.storage_align(copy, 0, axis=-2, factor=32, offset=8)

    a_shared, b_shared = to_shared(0), to_shared(1)
    auto_inline_producers(sch, a_shared)
    auto_inline_producers(sch, b_shared)
    distribute(a_shared)
    distribute(b_shared)

    # 5. shared -> registers (ldmatrix), the accumulators in registers (warp scope)
    a_frag = sch.cache_read(outer, 0, "warp")
    b_frag = sch.cache_read(outer, 1, "warp")
    sch.compute_at(a_frag, k1)
    sch.compute_at(b_frag, k1)
    to_global = sch.cache_write(outer, 0, "shared.dyn")
    acc = sch.cache_write(outer, 0, "warp")
    sch.reverse_compute_at(acc, warp)
    sch.reverse_compute_at(to_global, warp)

    def fragments(block):
        """Tile the block's last two loops into 16 x 16 fragments; the inner pair's first loop."""
        r, c = sch.get_loops(block)[-2:]
        r0, r1 = sch.split(r, [None, FRAGMENT])
        c0, c1 = sch.split(c, [None, FRAGMENT])
        sch.reorder(r0, c0, r1, c1)
        return r1

    a_load, b_load, store = fragments(a_frag), fragments(b_frag), fragments(acc)

    def layout(*index):
        *rest, row, col = index
        return (*rest, row // FRAGMENT, col // FRAGMENT,
                *shared_16x16_to_ldmatrix_32x8_layout(row % FRAGMENT, col % FRAGMENT))

    sch.transform_layout(a_frag, ("write", 0), layout)
    sch.transform_layout(b_frag, ("write", 0), layout)
    sch.transform_layout(acc, ("read", 0), layout)
    init = sch.decompose_reduction(outer, k0)
    intrinsics = get_mma_intrin_group(load_scope="shared.dyn", store_scope="shared.dyn",
                                      in_dtype=in_dtype, out_dtype=accumulator, trans_a=False,
                                      trans_b=trans_b)
    sch.tensorize(a_load, intrinsics["load_a"])
    sch.tensorize(b_load, intrinsics["load_b"])
    sch.tensorize(sch.get_loops(inner)[-3], intrinsics["compute"])
    sch.tensorize(sch.get_loops(sch.get_child_blocks(init)[0])[-2], intrinsics["init"])
    # rows of the accumulators' shared copy padded by 8 floats: one store of a register a
    # thread writes 8 rows x 4 column pairs, which rows of 32 x k floats would put in the same
    # 4 banks (aligned on the fragment's block, which tensorize keeps)
    store = sch.blockize(store)
    sch.storage_align(store, 0, axis=-2, factor=32, offset=8)
    sch.tensorize(store, intrinsics["store"])

    # 6. the epilogue on the way out: up to 16 bytes of the output a thread, as many as divide
    #    the output's rows (a vector must not straddle two rows: misaligned addresses)
    auto_inline_consumer_chain(sch, to_global)
    out = sch.get(to_global).writes[0].source
    width = lanes_for(n, 16 * 8 // tvm.runtime.DataType(out.dtype).bits)
    epilogue = sch.get(to_global)
    if width > EPILOGUE_CONSTANT_LANES and (_computes_constant_or_intrinsic(epilogue)
                                            or _broadcasts(epilogue)):
        width = EPILOGUE_CONSTANT_LANES
    fused = sch.fuse(*sch.get_loops(to_global)[-2:])
    _, tx, lanes = sch.split(fused, [None, WARP, width])
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(lanes)

    # 7. the pipeline: fragments of the next k1 step loaded while this one's mma run (that loop
    #    is pipelined first: its prologue, body and epilogue are three statements of k0's body),
    #    and `stages` K steps of copies in flight (cp.async)
    last = tile.stages - 1
    sch.annotate(k0, "software_pipeline_stage", [0, 0, last, last, last])
    sch.annotate(k0, "software_pipeline_order", [0, 1, 2, 3, 4])
    sch.annotate(k0, "software_pipeline_async_stages", [0])
    sch.annotate(k1, "software_pipeline_stage", [0, 0, 1])
    sch.annotate(k1, "software_pipeline_order", [0, 1, 2])
    if tile.blocks_per_sm is not None:
        return s_tir.Schedule(_min_blocks_per_sm(sch.mod["main"], tile.blocks_per_sm))
    return sch


#: The most lanes of an epilogue that computes with a float32 value the same in every lane: a
#: constant, a math intrinsic (Cohere's SiLU gate: ``sigmoid`` lowers to ``1 / (1 + exp(-x))``)
#: or an element read once for the vector (a row's scale, Inkling's): TVM's CUDA codegen
#: prints eight float32 lanes as a ``ulonglong4``, and the broadcast of such a value as
#: ``make_ulonglong4`` of eight floats, which neither nvcc nor NVRTC compiles ("too many
#: arguments in function call"; ``benchmarks/coverage.py --target cuda-sm90 --dtype fp16``).
EPILOGUE_CONSTANT_LANES = 4
#: A float32 constant or an intrinsic call other than a cast, as TVMScript prints them (TVM
#: 0.27's Python API has no TIR expression visitor).
_CONSTANT_OR_INTRINSIC = re.compile(r"T\.float32\(|T\.(?!u?int\d+\(|b?float16\()[a-z_]+\(")


def _computes_constant_or_intrinsic(block: s_tir.stmt.SBlock) -> bool:
    """Whether ``block``'s body computes with a float32 constant or a math intrinsic."""
    return _CONSTANT_OR_INTRINSIC.search(str(block.body)) is not None


def _enters(node, var, lanes: int | None = None) -> bool:
    """Whether index expression ``node`` varies with ``var``; with ``lanes``, not where ``var``
    enters only through a division by a multiple of ``lanes`` (constant along an aligned vector
    of that many: the conv's tap index ``k // 64``)."""
    if lanes is not None and isinstance(node, tirx.FloorDiv) and \
            isinstance(node.b, tirx.IntImm) and int(node.b) % lanes == 0:
        return False
    return node.same_as(var) or any(
        _enters(operand, var, lanes) for operand in (getattr(node, "a", None),
                                                     getattr(node, "b", None))
        if operand is not None)


def _broadcasts(block: s_tir.stmt.SBlock) -> bool:
    """Whether ``block`` reads an element at an index its innermost axis (the one its vector
    runs along) does not enter: one value for every lane, broadcast (a float16 one is cast to
    float32 before it is, and printed the same way)."""
    inner = block.iter_vars[-1].var
    return any(not any(_enters(index.min, inner) for index in region.region)
               for region in block.reads)


def _ramp_lanes(block: s_tir.stmt.SBlock, lanes: int) -> int:
    """``lanes``, or 4 where ``block`` reads at an index of its innermost axis divided (or
    taken modulo) by a constant that ``lanes`` does not divide: 8 lanes of int32 index math
    are not printable by TVM's CUDA codegen, 4 are (``make_int4``)."""
    inner = block.iter_vars[-1].var  # the axis the vector runs along
    broken = any(isinstance(node, (tirx.FloorDiv, tirx.FloorMod))
                 and isinstance(node.b, tirx.IntImm) and int(node.b) % lanes
                 and _enters(node.a, inner, lanes)
                 for node in read_index_nodes(block))
    return min(lanes, 4) if broken else lanes


def _aligned_lanes(block: s_tir.stmt.SBlock, lanes: int) -> int:
    """``lanes`` where every vector ``block`` copies from a global buffer starts at a multiple
    of ``lanes`` elements, else 1 (element copies): the buffer's rows (its last extent) a
    multiple of it, and its last index one wherever the vector's axis (the block's innermost)
    is (a slice at an odd offset, a conv's window read through a permute). A vector copy from
    an unaligned address (cp.async of 16 bytes) faults with a misaligned address: SegFormer's
    8 x 8 stride-8 convs over an NCHW input were copied at odd element offsets."""
    analyzer = tvm.sym.Analyzer()
    inner = block.iter_vars[-1].var
    analyzer.bind(inner, tirx.Var("vector", inner.ty) * lanes)  # a vector's first element
    for region in block.reads:
        if region.source.scope() != "global" or not region.source.shape:
            continue
        for term in (region.source.shape[-1], analyzer.simplify(region.region[-1].min)):
            known = analyzer.modular_set(term)
            if known.coeff % lanes or known.base % lanes:
                return 1
    return lanes


def _min_blocks_per_sm(func: tirx.PrimFunc, blocks: int) -> tirx.PrimFunc:
    """``func`` with the attribute that makes CUDA codegen write ``__launch_bounds__(threads,
    blocks)``: SplitHostDevice takes it from inside the kernel, so it wraps the body of the
    outermost thread-bound loop (the root block's one child, where the schedule above puts it)."""
    realize = func.body
    root = realize.block
    loop = root.body
    assert isinstance(loop, tirx.For) and loop.thread_binding is not None, "a bound loop first"
    loop = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, tirx.AttrStmt(
        tvm.runtime.convert(""), "tirx.launch_bounds_min_blocks_per_sm", blocks, loop.body),
        loop.thread_binding, loop.annotations)
    root = s_tir.stmt.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, loop,
                             root.init, root.alloc_buffers, root.match_buffers, root.annotations)
    return func.with_body(s_tir.stmt.SBlockRealize(realize.iter_values, realize.predicate, root))
