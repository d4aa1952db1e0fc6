"""The register-blocked reduction schedule that the conv, dense and pooling rules share.

It fits every kernel whose one reduction (the *anchor*: a conv, matmul or pool) writes an output
whose innermost axis is also the innermost axis of one of its inputs: NHWC convs with HWIO
weights (output channels), matmuls with a ``[K, N]`` right operand (columns), depthwise convs and
pools in NHWC (channels). That axis is vectorized; the axis next to it is blocked so that a tile
of ``rows x (blocks x lanes)`` accumulators stays in vector registers while the whole reduction
runs over it, then the fused epilogue (bias, residual, activation) is applied to the tile before
it is written, once. The outer tiles run on the thread pool, the output-channel tile outermost so
that each thread keeps one panel of weights in cache across rows::

    parallel for (col_tile, ..., row_tile):      # weights panel reused across row tiles
        acc[rows, blocks*lanes] = 0              # registers
        for reduction axes:                      # e.g. kh, kw, cin
            for r in rows (unrolled):            # broadcast one input, FMA into `blocks` vectors
                for b in blocks (unrolled):
                    acc[r, b*lanes:(b+1)*lanes] += x[r, k] * w[k, b*lanes:(b+1)*lanes]
        out[tile] = epilogue(acc)                # vectorized, inlined bias/residual/activation

The weights, when they are constants, are read from panels packed at build time (see
:func:`pack_panels`): ``w[k, b*lanes:(b+1)*lanes]`` above is then ``P[tile, k, b*lanes:...]``,
each step's vectors next to the last step's instead of a row of ``W`` apart.

Producers (padding, a transpose, a concatenation) stay separate loop nests, run in parallel, and
what feeds them (a strided slice into a concatenation) is inlined into them: inlining a padding
test into the innermost loop halved the speed of a 3x3 conv, and of ResNet-50's stride-2 3x3
convs (110 -> 47 GFLOP/s). The exception is a strided depthwise conv, whose padded input is
more than twice the size of its output and is read as whole vectors: there, copying it costs
more than the tests (MobileNetV2's on 112x112x96: 0.36 ms with the copy, 0.19 ms without).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad  # a BufferLoad (tirx.BufferLoad is a constructor)

from tvmfuse.names import LAYOUT_FREE_BUFFERS, LAYOUT_REWRITE_PREPROC, PART_TAIL

from ..tir_util import (
    inline_into_consumers, is_reduction, lanes_for, loops_match_iters, read_index_nodes,
    root_blocks, static_extent, static_int, uses,
)
from ._tir import Vector, parallelize


@dataclass(frozen=True)
class Tile:
    """Register tile: ``rows`` x ``blocks`` vectors of ``lanes``."""

    rows: int
    blocks: int
    lanes: int


def anchor_of(sch: s_tir.Schedule):
    """The kernel's only reduction block, or None."""
    reductions = [b for b in root_blocks(sch) if is_reduction(sch, b)]
    return reductions[0] if len(reductions) == 1 else None


#: How fast a tile of ``blocks`` column vectors runs relative to four, per accumulator
#: (197x768x1000 padded to whole tiles on Zen 4: 4x4 220 GFLOP/s, 8x2 164, 16x1 131: fewer
#: blocks broadcast more inputs per FMA). The odd widths fit narrow outputs; per accumulator
#: and real column they ran at least as fast as 4x4 (Zen 4, 197 x 768 GEMMs, GFLOP/s of the
#: real columns): 5x3 ran 48 / 144 columns at 185 / 180 where 4x4 over 64 / 192 ran 142 / 138;
#: 3x5 ran 197 (240 wide) at 154 where 4x4 (256) ran 141, and 77 (80) at 170 where 8x2 (96)
#: ran 130; 2x7 ran 100 (112) at 147 where 4x4 (128) ran 134.
BLOCK_EFFICIENCY = {4: 1.0, 2: 0.8, 1: 0.6, 3: 1.0, 5: 1.05, 7: 1.02}
#: The same for a GEMM's tiles in a file of 16 registers (AVX2, SSE), where the weights of four
#: blocks leave room for only two rows (four blocks are never chosen there). Measured on a 2-core
#: Zen 3 (kernel_bench.py dense --tiles, fastest of 3-4 interleaved rounds, GFLOP/s): 6 x 2 ran
#: 77x768x3072 at 166, 77x3072x768 at 187, 197x768x768 at 185 where the 2 x 4 then chosen ran 144,
#: 147 and 168, and 4 x 3 162, 176 and 183. Convs keep the half-file tiles: their 3x3 kernels alone
#: ran 3-8% faster in 6 x 2, but ResNet-50 as a whole 7% slower (58.0 -> 62.1 ms, 12 interleaved
#: rounds: its 7- and 14-column maps fill 58% and 78% of six-row tiles).
BLOCK_EFFICIENCY_16 = {2: 1.0, 3: 0.95, 4: 0.85, 1: 0.6}
#: Accumulators a tile of this many blocks may hold beyond half the register file.
WIDE_ROWS = {7: 8}
#: What a GEMM's tile in 16 registers loses for holding fewer than its 12 accumulators: the share
#: it holds, to this power (linear, it made six rows win wherever they were within a sixth of the
#: rows' padding). Measured on a 2-core Zen 3 (one tile forced per build, fastest of 5 interleaved
#: rounds, GFLOP/s): where every tile divides the rows, 60 x 3072 x 768 ran 195.8 in 6 x 2, 192.6
#: in 5 x 2 (10 of 12: 0.98), 183.2 in 4 x 2 (8 of 12: 0.94), and 60 x 768 x 768 192.6 / 192.0 /
#: 183.2; where six rows do not divide them, 49 x 3072 x 768 (ConvNeXt's last stage) ran 183.3 in
#: 5 x 2 where 6 x 2 (54 rows) ran 173.2, and 50 x 768 x 3072 (CLIP's 50 tokens) 190.5 where 6 x 2
#: ran 176.0; 197 x 768 x 768 stays 6 x 2 (186.5; 5 x 2 183.3).
FILL_EXPONENT_16 = 0.15
#: What a GEMM's tile in 32 registers loses where the rows are padded to whole tiles, beyond the
#: padded rows' own share: on Zen 4 (one tile forced per build, fastest of 7 profiles, GFLOP/s,
#: two rounds), 50 rows ran 50 x 768 x 3072 at 186-194, 50 x 3072 x 768 at 172-198 and
#: 50 x 768 x 768 at 165-194 in 4 x 4 tiles over 52 rows, where 5 x 3 (dividing 50) ran
#: 212-222, 217 and 216-221; at 52 rows 4 x 4 ran 209-215 / 201-206 / 205-215 (and 5 x 3 over
#: 55, 171-190). Rows every candidate pads (197, 61) keep their choice.
PADDED_ROWS_32 = 0.9


#: The L2 cache a core's GEMM tiles share with nothing else (Zen 4 and Zen 5: 1 MiB; Zen 3
#: 512 KiB, whose AVX2 tiles are 16 columns wide; Emerald Rapids 2 MiB).
L2_BYTES = 1 << 20
#: What a GEMM's tile keeps of its rate when its weight panel (the reduction's depth x the
#: tile's columns) and its input rows do not fit in 7/8 of the L2: each row tile reads the panel
#: from L3 again. On 2 Zen 5 cores (kernel_bench.py dense, fastest of 5 rounds, GFLOP/s),
#: 197 x K x 768 in 3 x 7 tiles (112 columns) against 4 x 4 (64): K = 1024 429 / 450, 1536
#: 428 / 484, 2048 376 / 481, 3072 299 / 436 (4 x 4's own 786 KiB panel: 8 x 2 ran 466).
SPILLED_PANEL = 0.7


def _panel_fits(tile: Tile, depth: int) -> bool:
    return depth * 4 * (tile.blocks * tile.lanes + tile.rows) <= L2_BYTES * 7 // 8


def accumulator_budget(vector: Vector, tall: bool = False) -> int:
    """How many of the register file's vectors a tile's accumulators may take: half (measured on
    Zen 4: 8x2 and 4x4 tiles ran a 3x3 conv at 109 GFLOP/s, 4x1 at 108, 14x2 at 110), or for a
    ``tall`` tile (a GEMM's) in 16 registers 12 of them, two blocks of weights and a broadcast
    beside them (see BLOCK_EFFICIENCY_16)."""
    if tall and vector.registers < 32:
        return vector.registers * 3 // 4
    return vector.registers // 2


#: BLOCK_EFFICIENCY for a GEMM's tiles on cores whose 512-bit FMAs are full width (Zen 5; Zen 4
#: runs them in two halves): on 2 Zen 5 cores (`kernel_bench.py dense --rows 197 --tiles`, fastest
#: of 5 rounds, GFLOP/s, 8 x 2 / 4 x 4 / 5 x 3 / 6 x 2 / the padded 3 x 7), 197 x 768 x 768 ran
#: 477 / 466 / 473 / 471 / 444, x 2304 461 / 438 / 461 / 465 / 425, x 3072 453 / 447 / 446 /
#: 446 / 439, and 197 x 3072 x 768 439 / 398 / 433 / 439 / (3 x 7's panel spills).
BLOCK_EFFICIENCY_FULL_WIDTH = {2: 1.04, 4: 1.0, 3: 1.02, 5: 1.0, 7: 0.96, 1: 0.6}
#: The cores BLOCK_EFFICIENCY_FULL_WIDTH is for (LLVM's names).
FULL_WIDTH_CORES = ("znver5",)
#: BLOCK_EFFICIENCY for a GEMM's tiles on Intel's server cores, where a two-block tile takes ten
#: rows (INTEL_WIDE_ROWS: 20 accumulators, 23 registers with its weights and broadcast). On 2
#: Emerald Rapids cores (`kernel_bench.py dense --rows R --depth K --sizes N --tiles ...`,
#: fastest / median of 5-7 interleaved rounds, GFLOP/s), 10 x 2 against the tile chosen before:
#: 50 x 768 x 3072 317.8 / 300.9 against 5 x 3's 299.7 / 289.3, 50 x 3072 x 768 322.1 / 307.8
#: against 304.4 / 294.0 (5 x 4: 299.9 / 287.4), 50 x 768 x 768 350.4 / 335.6 against 339.1 /
#: 322.3; 197 x 768 x 3072 323.5 / 322.5 against 4 x 4's 317.9 / 313.4, 197 x 768 x 768 311.9 /
#: 307.5 against 300.0 / 299.9, 77 x 768 x 3072 305.5 / 297.0 against 288.8 / 286.8. Wider tiles
#: ran below 4 x 4: 197 x 768 x 3584 in 3 x 7 195.3, 8 x 2 199.4, 4 x 4 207.2; 197 x 768 x 3840
#: in 3 x 5 295.5, 4 x 4 312.0 (each pair in one run; the machine's rate drifts between runs).
BLOCK_EFFICIENCY_INTEL = {2: 1.04, 4: 1.0, 3: 0.97, 5: 0.95, 7: 0.94, 1: 0.6}
#: The cores BLOCK_EFFICIENCY_INTEL is for (LLVM's names).
INTEL_SERVER_CORES = ("sapphirerapids", "emeraldrapids", "graniterapids")
#: WIDE_ROWS for a GEMM's tiles on those cores.
INTEL_WIDE_ROWS = {**WIDE_ROWS, 2: 4}


def _block_efficiency(vector: Vector, tall: bool) -> dict[int, float]:
    if tall and vector.registers < 32:
        return BLOCK_EFFICIENCY_16
    if tall and vector.core in FULL_WIDTH_CORES:
        return BLOCK_EFFICIENCY_FULL_WIDTH
    if tall and vector.core in INTEL_SERVER_CORES:
        return BLOCK_EFFICIENCY_INTEL
    return BLOCK_EFFICIENCY


def _wide_rows(vector: Vector, tall: bool) -> dict[int, int]:
    return INTEL_WIDE_ROWS if tall and vector.core in INTEL_SERVER_CORES else WIDE_ROWS


def choose_tile(rows_extent: int | None, cols_extent: int, vector: Vector, *,
                pad: bool = False, tall: bool = False, depth: int | None = None) -> Tile | None:
    """The register tile with the best :func:`tile_score` for the output, leaving registers for
    the operands.

    ``rows x blocks`` accumulators plus ``blocks`` weight vectors and one broadcast must fit the
    register file; at most half of it holds accumulators (measured on Zen 4: 8x2 and 4x4 tiles
    ran a 3x3 conv at 109 GFLOP/s, 4x1 at 108, 14x2 at 110, the dense GEMM best at 4x4). Rows
    need not divide, and may be symbolic (``None``: a full tile): a GEMM's are padded to whole
    tiles (:func:`_row_multiple`), a conv's last row tile is predicated. Columns must divide
    unless ``pad``: then they are padded to whole tiles of full vectors (see :func:`_pad`).
    ``tall``: a GEMM's tile, which in 16 registers takes 12 accumulators (see
    :func:`accumulator_budget`); its reduction ``depth``, where known, weighs the tiles whose
    weight panel would not stay in the L2 (SPILLED_PANEL).
    """
    lanes = vector.lanes if pad else lanes_for(cols_extent, vector.lanes)
    if min(lanes, cols_extent) < min(4, vector.lanes):
        return None  # under four columns (a vector's worth) is not worth a tile
    budget = accumulator_budget(vector, tall)
    best = None
    for blocks in _block_efficiency(vector, tall):
        if not pad and (cols_extent // lanes) % blocks:
            continue
        if blocks % 2 and blocks > 1 and rows_extent is not None and rows_extent < budget // blocks:
            continue  # an odd width only where the rows fill it: a GEMV pays its padding in bytes
        # symbolic rows: a full tile; seven blocks take three rows (21 accumulators, with the 7
        # weights and the broadcast 29 registers of 32: 197 x 768 x 100 ran at 166 GFLOP/s
        # where 2 x 7 ran 140-146, and 197 columns at 164 where 3 x 5 over 240 ran 118-131)
        rows = min((budget + _wide_rows(vector, tall).get(blocks, 0)) // blocks,
                   rows_extent or budget)
        if rows * blocks + blocks + 1 > vector.registers:  # (AVX2's 16 registers)
            rows = min(budget // blocks, rows_extent or budget)
        if rows * blocks + blocks + 1 > vector.registers:
            continue
        if rows == 1 and blocks > 1 and (rows_extent is None or rows_extent > 1):
            # one row of several blocks (5 or 7 fit no more in 16 registers) uses each weight
            # vector once: the 1x1 conv 440 -> 440 on 7x7 ran at 90 GFLOP/s in 1 x 5 tiles, 148
            # in 7 x 1 (same Zen 3); taken only where the output has one row
            continue
        if not tall:
            rows = _dividing_rows(rows, rows_extent)
        # a GEMM's rows are padded to whole tiles: in 16 registers, shorter tiles that pad less
        # compete too (FILL_EXPONENT_16: 49 rows in 5 x 2, not 6 x 2 over 54)
        shorter = range(rows - 1, max(rows // 2, 1) - 1, -1) if (
            tall and vector.registers < 32 and rows_extent) else ()
        if tall and rows_extent and rows_extent < DIVIDING_GEMM_ROWS and not shorter:
            # in 32 registers, the most rows under the tile's that divide the GEMM's, so that
            # its rows need no padding (see DIVIDING_GEMM_ROWS)
            shorter = [r for r in range(rows - 1, max(rows // 2, 1) - 1, -1)
                       if rows_extent % r == 0][:1]
        for tile in (Tile(r, blocks, lanes) for r in (rows, *shorter)):
            if best is None or tile_score(tile, rows_extent, cols_extent, vector, tall,
                                          depth) > tile_score(best, rows_extent, cols_extent,
                                                              vector, tall, depth):
                best = tile
    return best


#: The most column tiles a depthwise conv's threads split by rows (``rows_outer``). With the
#: column tiles outermost each thread writes part of every pixel's channels: over 96 channels
#: (two tiles of 48) a 28x28 depthwise conv ran 58-75 us on two Zen 4 threads and 44-58 on one;
#: rows outermost, 31-35 (72 and 144 channels, three tiles: 20 -> 33 and 39 GFLOP/s). Over 480
#: and 672 channels (six tiles) rows outermost ran as fast or slower (672: 345-370 us against
#: 224-305).
ROWS_OUTER_TILES = 4

#: A conv's rows are not padded (see :func:`_pad`), so a tile that does not divide them is
#: predicated, which LLVM paid for in every tile: on a 2-core Zen 3 (AVX2), the 1x1 conv 104 -> 104
#: on 28x28 (RegNet's) ran at 54 GFLOP/s in 8 x 1 tiles and 113 in 7 x 1. A tile takes the
#: largest row count that divides the rows where that keeps at least this share of its rows.
DIVIDING_ROWS = 3 / 4


#: GEMMs over fewer rows than this (in 32 registers) also try the most rows under a tile's
#: that divide theirs: 49 rows (Winograd's 7x7 tiles of a 14x14 map, ResNet-50's third stage)
#: were padded to 52 in 4 x 4 tiles, with a copy of the input and a predicated output; 7 x 2
#: divides them. On 2 Zen 5 cores (kernel_bench.py dense --rows 49 --depth 256 --sizes 256
#: --tiles auto,4x4,7x2,8x2, fastest of 5 interleaved rounds) 377 / 368 / 428 / 343 GFLOP/s.
#: Larger row counts keep their choice (measured per core: see BLOCK_EFFICIENCY_INTEL).
DIVIDING_GEMM_ROWS = 64

#: What a pointwise (1x1) conv's tile keeps of its rate where its last row tile is predicated,
#: beyond the rows it wastes: the predicate guards every row's loads and FMAs in the reduction.
#: On 2 Zen 5 cores (one tile forced per build, fastest of 5 interleaved rounds, GFLOP/s), 4 x 4
#: against 7 x 2 (which divides the rows): 1024 -> 256 over 14x14 276 / 490, 256 -> 1024 271 /
#: 492, 2048 -> 512 over 7x7 341 / 510, 512 -> 2048 339 / 498 (ResNet-50's last two stages). 3x3
#: convs over 7x7 with 64-256 channels ran as fast or faster in 4 x 4 (64: 311 / 255).
PREDICATED_POINTWISE = 0.55

#: The most rows :func:`dividing_tile` gives a tile, and the share of the register file its
#: accumulators may take (a seven-row tile of three blocks: 21 of 32).
DIVIDING_TILE_ROWS = 8
DIVIDING_TILE_FILL = 3 / 4


def dividing_tile(rows_extent: int, cols_extent: int, vector: Vector, *,
                  pad: bool = False, depth: int | None = None) -> Tile | None:
    """The best-scoring tile whose rows divide ``rows_extent`` (2 to DIVIDING_TILE_ROWS of
    them), for rows that are never padded and that :func:`choose_tile`'s tile does not divide:
    merged rows (see :func:`_row_multiple`). ConvNeXt's last stage, a GEMM over 7 x 7 = 49 rows
    (one tile forced per build, Zen 4, GFLOP/s, fastest of 7): 49 x 768 x 3072 + GELU ran 128
    in the predicated 3 x 7 tiles chosen before, 233 in 7 x 3, 231 in 7 x 2; 49 x 3072 x 768
    124.5 / 230 / 223. None where no such tile fits the register file."""
    lanes = vector.lanes if pad else lanes_for(cols_extent, vector.lanes)
    if min(lanes, cols_extent) < min(4, vector.lanes):
        return None
    candidates = [
        Tile(rows, blocks, lanes)
        for rows in range(min(DIVIDING_TILE_ROWS, rows_extent), 1, -1) if rows_extent % rows == 0
        for blocks in BLOCK_EFFICIENCY
        if (pad or (cols_extent // lanes) % blocks == 0)
        and rows * blocks + blocks + 1 <= vector.registers
        and rows * blocks <= vector.registers * DIVIDING_TILE_FILL]
    return max(candidates, key=lambda t: tile_score(t, rows_extent, cols_extent, vector,
                                                    depth=depth), default=None)


def _dividing_if_better(tile: Tile, rows: int, cols: int, vector: Vector, depth: int | None, *,
                        pad: bool = False, pointwise: bool = False) -> Tile:
    """``tile``, or a tile whose rows divide a conv's ``rows`` (:func:`dividing_tile`) where that
    scores higher. A conv's last row tile is predicated, not padded: over a 5x5 map, 4 x 4 tiles
    computed 8 rows for every 5 (ResNet-18's last stage at 160 px, 3x3 512 -> 512: 275 GFLOP/s,
    5 x 4 463; 256 -> 512 with stride 2 from 10x10: 309 -> 466; 256 -> 256 over 10x10: 470 -> 493;
    fastest of 5 interleaved rounds, 2 Zen 5 cores). A ``pointwise`` conv (1x1) pays for the
    predicate far beyond the rows it wastes (PREDICATED_POINTWISE)."""
    dividing = dividing_tile(rows, cols, vector, pad=pad, depth=depth)
    if dividing is None:
        return tile
    score = tile_score(tile, rows, cols, vector, depth=depth)
    if pointwise:
        score *= PREDICATED_POINTWISE
    return dividing if tile_score(dividing, rows, cols, vector, depth=depth) > score else tile


def _dividing_rows(rows: int, rows_extent: int | None) -> int:
    """``rows``, or fewer that divide ``rows_extent`` (see DIVIDING_ROWS)."""
    if not rows_extent or rows_extent % rows == 0:
        return rows
    fewer = next(d for d in range(rows, 0, -1) if rows_extent % d == 0)
    return fewer if fewer >= rows * DIVIDING_ROWS else rows


def tile_score(tile: Tile, rows: int | None, cols: int, vector: Vector,
               tall: bool = False, depth: int | None = None) -> float:
    """The expected share of the FMA peak: accumulators doing real rows and columns, in full
    vectors, with enough blocks to reuse each broadcast, and (a GEMM's, of reduction ``depth``)
    weights that stay in the L2 across its row tiles."""
    width = tile.blocks * tile.lanes
    useful = cols / (-(-cols // width) * width)
    if rows:
        useful *= rows / (-(-rows // tile.rows) * tile.rows)
    budget = accumulator_budget(vector, tall)
    filled = min(tile.rows * tile.blocks, budget) / budget
    if tall and vector.registers < 32:
        filled **= FILL_EXPONENT_16
    if tall and vector.registers >= 32 and rows and rows % tile.rows:
        useful *= PADDED_ROWS_32
    efficiency = _block_efficiency(vector, tall).get(tile.blocks, 0.0)
    if depth and not _panel_fits(tile, depth):
        efficiency *= SPILLED_PANEL
    return efficiency * useful * filled * tile.lanes / vector.lanes


def register_blocked(func: tirx.PrimFunc, vector: Vector, claims: Callable[[str], bool], *,
                     inline_large_padding: bool = False, tall: bool = False,
                     rows_outer: bool = False):
    """Schedule ``func`` as a register-blocked reduction, or return None when it is not one
    or its anchor block is not one the caller ``claims`` (by block name).

    ``inline_large_padding`` reads through a padding more than twice the output's size instead
    of copying it (see the module docstring; it pays only where the input is read as vectors).
    ``rows_outer``: the threads split the rows, not the column tiles (see :func:`block_anchor`).
    """
    sch = s_tir.Schedule(func)
    anchor = anchor_of(sch)
    if anchor is None or not claims(sch.get(anchor).name_hint):
        return None
    blocks = root_blocks(sch)
    if block_anchor(sch, anchor, vector, epilogue=blocks[_position(sch, anchor) + 1:],
                    inline_large_padding=inline_large_padding, tall=tall,
                    rows_outer=rows_outer) is None:
        return None
    return sch


def block_anchor(sch: s_tir.Schedule, anchor, vector: Vector, *, epilogue: list,
                 written: tuple = (), inline_large_padding: bool = False,
                 tall: bool = False, rows_outer: bool = False):
    """Register-block the reduction ``anchor`` of ``sch`` in place; returns the parallel loop
    its tiles run under, or None (``sch`` untouched) when it does not fit.

    The blocks before it are its producers; of ``epilogue``, the blocks after it, those that can
    be are inlined and the others are written from the tile, as are the ``written`` blocks (an
    intermediate that later blocks of the kernel read, which inlining would compute again).

    ``rows_outer`` puts the row tiles outside the column tiles in the parallel loop where the
    columns are at most ROWS_OUTER_TILES tiles, for a kernel whose weights are not reused across
    rows (a depthwise conv); see ROWS_OUTER_TILES.
    """
    if not loops_match_iters(sch, anchor):
        return None
    block = sch.get(anchor)
    loops = sch.get_loops(anchor)
    kinds = [iv.iter_type == tirx.IterVar.DataPar for iv in block.iter_vars]
    spatial = [loop for loop, is_spatial in zip(loops, kinds) if is_spatial]
    reduce = [loop for loop, is_spatial in zip(loops, kinds) if not is_spatial]
    vector_axis = [iv.var for iv, is_spatial in zip(block.iter_vars, kinds) if is_spatial]
    if not spatial or not reduce or not _is_contiguous(block, vector_axis[-1]):
        return None
    vector = _within_groups(block, vector_axis[-1], vector)
    cols = static_extent(sch, spatial[-1])
    rows = static_extent(sch, spatial[-2]) if len(spatial) > 1 else 1
    if cols is None:
        return None
    merged = _row_axes(sch, anchor)
    if merged is not None:
        rows = math.prod(static_extent(sch, loops[i]) for i in merged)
    depth = math.prod(static_extent(sch, loop) or 0 for loop in reduce) or None
    # a pointwise conv: no reduction over the map, only over the input channels
    pointwise = len(reduce) > 1 and all(static_extent(sch, loop) == 1 for loop in reduce[:-1])
    tile = choose_tile(rows, cols, vector, tall=tall, depth=depth)
    undivided = merged is not None and tile is not None and rows % tile.rows != 0
    if undivided:
        # merged rows stay predicated (see _row_multiple): a tile that does not divide them
        # kept every tile's accumulators in memory (ConvNeXt's 3136/784/196-row GEMMs in six-row
        # tiles on a Zen 3: 82-98 GFLOP/s, the model 63 -> 113 ms); the half-file tile divides
        # those, and rows it does not divide either (49) take a tile whose rows do
        tall = False
        tile = choose_tile(rows, cols, vector)
        if rows % tile.rows:
            tile = dividing_tile(rows, cols, vector, depth=depth) or tile
    elif merged is None and not tall and tile is not None and rows % tile.rows:
        tile = _dividing_if_better(tile, rows, cols, vector, depth, pointwise=pointwise)
    padded = choose_tile(rows, cols, vector, pad=True, tall=tall, depth=depth)
    if undivided and padded is not None and rows % padded.rows:
        padded = dividing_tile(rows, cols, vector, pad=True, depth=depth)
    elif merged is None and not tall and padded is not None and rows % padded.rows:
        padded = _dividing_if_better(padded, rows, cols, vector, depth, pad=True,
                                     pointwise=pointwise)
    # a column tail, or columns no large tile divides: whole tiles over padded columns; and the
    # rows in whole tiles (see _row_multiple)
    better = padded is not None and (tile is None or (
        tile_score(padded, rows, cols, vector, tall, depth)
        > tile_score(tile, rows, cols, vector, tall, depth)))
    if better and _pads_weights(sch, anchor):
        if _pad(sch, anchor, padded, columns=True,
                rows=_row_multiple(rows, padded, merged)):
            tile = padded
    elif tile is not None:
        _pad(sch, anchor, tile, rows=_row_multiple(rows, tile, merged))
    if tile is None:
        return None
    if merged is not None:
        _merge_rows(sch, anchor, merged)
    block = sch.get(anchor)
    loops = sch.get_loops(anchor)
    kinds = [iv.iter_type == tirx.IterVar.DataPar for iv in block.iter_vars]
    spatial = [loop for loop, is_spatial in zip(loops, kinds) if is_spatial]
    reduce = [loop for loop, is_spatial in zip(loops, kinds) if not is_spatial]
    vector_axis = [iv.var for iv, is_spatial in zip(block.iter_vars, kinds) if is_spatial]
    # the copy out of the padded accumulators (the anchor's consumer, when padded) joins the
    # epilogue, where it is inlined
    epilogue = [c for c in sch.get_consumers(anchor) if _is_crop(sch, c)] + list(epilogue)

    blocks = root_blocks(sch)
    position = _position(sch, anchor)
    pack_panels(sch, anchor, vector_axis[-1], tile.blocks * tile.lanes)
    for producer in blocks[:position]:
        if LAYOUT_REWRITE_PREPROC in sch.get(producer).annotations:
            continue  # a padded weight, packed at build time
        if _is_plain_copy(sch, producer) or (
                inline_large_padding and _padding_outweighs_output(sch, producer, anchor)):
            sch.compute_inline(producer)
        elif not _feeds(sch, producer, anchor) and _inlined(sch, producer):
            continue  # glue before another producer (a transpose before the padding)
        else:
            parallelize(sch, producer, vector.lanes)
    outputs = inline_into_consumers(sch, epilogue) + list(written)
    if outputs:
        sch.set_scope(anchor, 0, "local")  # the tile's accumulators
    else:
        outputs = [sch.cache_write(anchor, 0, "local")]

    col_outer, col_block, col_lane = sch.split(spatial[-1], [None, tile.blocks, tile.lanes])
    col_tiles = static_extent(sch, col_outer)
    if len(spatial) > 1:
        row_outer, row_inner = sch.split(spatial[-2], [None, tile.rows])
        split_rows = rows_outer and static_extent(sch, col_outer) <= ROWS_OUTER_TILES
        outer = ([*spatial[:-2], row_outer, col_outer] if split_rows
                 else [col_outer, *spatial[:-2], row_outer])
        inner = [row_inner, col_block, col_lane]
    else:
        outer, inner = [col_outer], [col_block, col_lane]
    # the parallel iterations of one column tile, where the last column tile's are the last ones
    per_column_tile = (math.prod(static_extent(sch, loop) or 0 for loop in outer[1:]) or None
                       if outer[0] is col_outer and (col_tiles or 0) > 1
                       else None)
    sch.reorder(*outer, *reduce, *inner)
    tiles = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    sch.parallel(tiles)
    for loop in inner[:-1]:
        sch.unroll(loop)
    sch.vectorize(inner[-1])

    for output in outputs:
        sch.reverse_compute_at(output, tiles)
        tail = sch.get_loops(output)[1:]  # the loops inside the tile
        columns = static_extent(sch, tail[-1])
        if columns is not None and columns % tile.lanes:
            # rows of a tile that are not whole vectors (one column tile over 77 columns, or
            # over a conv's 72 channels padded to 80): each row's whole vectors are stored apart
            # from its last one, which the column predicate masks (PART_TAIL); fused with the
            # rows, a vector would span two rows and every store was predicated per lane
            vectors, lane = sch.split(tail[-1], [None, tile.lanes])
            if columns > tile.lanes:
                sch.annotate(vectors, PART_TAIL, columns // tile.lanes)
        else:
            fused = sch.fuse(*tail) if len(tail) > 1 else tail[0]
            _, lane = sch.split(fused, [None, tile.lanes])
        sch.vectorize(lane)
    init = sch.decompose_reduction(anchor, reduce[0])
    sch.vectorize(sch.get_loops(init)[-1])
    width = tile.blocks * tile.lanes
    if per_column_tile and any(_columns(sch, output) % width for output in outputs):
        # the last column tile writes fewer columns than it computes, under a predicate that
        # scalarized every tile's stores: its iterations run apart (tvmfuse.passes.part_tail)
        sch.annotate(tiles, PART_TAIL, (col_tiles - 1) * per_column_tile)
    return tiles


def _columns(sch: s_tir.Schedule, block) -> int:
    """The columns ``block`` writes (its innermost spatial extent; 0 where symbolic)."""
    iters = [iv for iv in sch.get(block).iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    return (static_int(iters[-1].dom.extent) or 0) if iters else 0


def _row_axes(sch: s_tir.Schedule, anchor) -> range | None:
    """The anchor's spatial axes before its columns that are rows of one matrix: a matmul of
    ``[1, 14, 14, 384]`` activations (ConvNeXt's pointwise layers, in NHWC) has 196 rows, which
    :func:`_merge_rows` makes one axis, where the register tile saw rows of 14 (two of its four
    row tiles partly empty: 157 GFLOP/s; merged, 214 on Zen 4). Axes qualify, from the one next
    to the columns outwards, while every buffer the anchor reads or writes either indexes them
    all, as plain variables in consecutive dimensions and in order, or none of them (a conv's
    input, read at ``h * stride + kh``, does not qualify; a batched matmul's weight, indexed by
    the batch axis, stops the run there); and every block after the anchor is an elementwise
    epilogue over the same rows. None when fewer than two qualify."""
    block = sch.get(anchor)
    iters = list(block.iter_vars)
    spatial = [i for i, iv in enumerate(iters) if iv.iter_type == tirx.IterVar.DataPar]
    if len(spatial) < 3 or spatial != list(range(len(spatial))):
        return None
    regions = [r.region for r in (*block.reads, *block.writes)]
    static = [static_int(iv.dom.extent) for iv in iters]
    start = spatial[-2]
    if static[start] is None:
        return None
    while start > 0 and static[start - 1] is not None and _plain_run(
            regions, [iv.var for iv in iters[start - 1:spatial[-1]]]):
        start -= 1
    run = range(start, spatial[-1])
    if len(run) < 2 or not _plain_run(regions, [iters[i].var for i in run]):
        return None
    extents = static[run.start:run.stop]
    if math.prod(extents) == extents[-1]:
        return None  # the others are 1: nothing to merge
    for later in root_blocks(sch)[_position(sch, anchor) + 1:]:
        stmt = sch.get(later)
        if (is_reduction(sch, later) or not loops_match_iters(sch, later)
                or len(stmt.iter_vars) != len(spatial)
                or [static_int(stmt.iter_vars[i].dom.extent) for i in run] != extents):
            return None
    return run


def _plain_run(regions, axes: list) -> bool:
    """Each region indexes ``axes`` as consecutive plain dimensions in order, or none of them."""
    for region in regions:
        starts = [r.min for r in region]
        used = [i for i, start in enumerate(starts) if any(uses(start, a) for a in axes)]
        if not used:
            continue
        first = used[0]
        if used != list(range(first, first + len(axes))) or not all(
                starts[first + j].same_as(a) for j, a in enumerate(axes)):
            return False
    return True


def _merge_rows(sch: s_tir.Schedule, anchor, run: range) -> None:
    """Make the axes ``run`` of the anchor and of every block after it one axis (see
    :func:`_row_axes`); the buffers they write inside the kernel take the merged shape, so that
    a register tile's accumulators stay one rectangle. The kernel's parameters keep theirs: they
    are read and written at ``f // 14, f % 14``."""
    extents = [int(sch.get(anchor).iter_vars[i].dom.extent) for i in run]

    def merge(*index):
        flat = index[run.start]
        for i, extent in zip(run[1:], extents[1:]):
            flat = flat * extent + index[i]
        return (*index[:run.start], flat, *index[run.stop:])

    params = list(sch.mod["main"].params)  # buffers, in TIRx
    for block in root_blocks(sch)[_position(sch, anchor):]:
        iters = len(sch.get(block).iter_vars)
        sch.transform_block_layout(block, tirx.IndexMap.from_func(merge, ndim=iters))
        for index, region in enumerate(sch.get(block).writes):
            if not any(region.source.same_as(p) for p in params):
                sch.transform_layout(block, ("write", index), merge)


def pack_panels(sch: s_tir.Schedule, anchor, axis: tirx.Var, panel: int):
    """Read the anchor's weights in panels of ``panel`` output columns, packed at build time.

    A weight ``W[k..., n]`` that the kernel's ``layout_free_buffers`` attribute names (a
    constant: see MarkWeightsLayoutFree) and that the anchor reads at ``[reduction..., axis]``
    (or ``[batch, reduction, axis]``, a batched matmul's: Winograd's 16 products) is
    read instead from ``P[n // panel, k..., n % panel]``, written by a block annotated for
    SplitLayoutRewritePreproc, which the build moves out of the kernel to run once on the
    constant (PrepackWeights).
    Then a register tile's weights for one reduction step are one contiguous ``panel`` of floats,
    and consecutive steps are next to each other, where ``W`` has them ``N`` floats apart.
    Returns the packing block, or None when no weight qualifies.
    """
    weights = _layout_free_weights(sch)
    if not weights:
        return None
    block = sch.get(anchor)
    spatial = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    # the reduction axes, and the batch axes of a batched matmul (not the rows: those a
    # weight is shared by)
    shared = [iv.var for iv in block.iter_vars if iv.iter_type != tirx.IterVar.DataPar]
    shared += spatial[:-2]
    padded = [(sch.get(p).writes[0].source, p) for p in sch.get_producers(anchor)
              if _pads_one_of(sch, p, weights)]
    for index, region in enumerate(block.reads):
        pads = [p for buffer, p in padded if region.source.same_as(buffer)]
        if not pads and not any(region.source.same_as(w) for w in weights):
            continue
        starts = [r.min for r in region.region]
        if not (starts[-1].same_as(axis) and all(
                any(s.same_as(r) for r in shared) for s in starts[:-1])):
            continue
        # a weight padded to whole panels (see _pad) is packed by its padding block
        packing = pads[0] if pads else sch.cache_read(anchor, index, "global")
        sch.annotate(packing, LAYOUT_REWRITE_PREPROC, True)
        sch.transform_layout(anchor, ("read", index),
                             lambda *i: (i[-1] // panel, *i[:-1], i[-1] % panel))
        return packing
    return None


def _pads_weights(sch: s_tir.Schedule, anchor) -> bool:
    """What the anchor reads along its output columns is weights packed at build time (padding
    them costs nothing per call; an activation would be copied on every call: a pool's input,
    1.6 MB)."""
    block = sch.get(anchor)
    iters = block.iter_vars
    last = max(i for i, iv in enumerate(iters) if iv.iter_type == tirx.IterVar.DataPar)
    weights = _layout_free_weights(sch)
    along = [r.source for r in block.reads if r.region[-1].min.same_as(iters[last].var)]
    return bool(along) and all(any(b.same_as(w) for w in weights) for b in along)


def _layout_free_weights(sch: s_tir.Schedule) -> list:
    """The kernel's parameters that every call passes a constant (its ``layout_free_buffers``,
    from MarkWeightsLayoutFree): the weights a schedule may lay out at build time."""
    func = sch.mod["main"]
    free = func.attrs.get(LAYOUT_FREE_BUFFERS) if func.attrs is not None else None
    return [func.params[int(i)] for i in free or ()]


def _row_multiple(rows: int | None, tile: Tile, merged) -> int:
    """What a GEMM pads its rows to a multiple of (0: not padded): whole tiles. Unpadded, the
    last tile is predicated, and LLVM keeps the accumulators of its rows that may be empty in
    memory, in every tile: 50x768x768 ran at 136-166 GFLOP/s, 52 rows at 224. Merged rows
    (:func:`_merge_rows`) are not an einsum's axis: they stay predicated."""
    if merged is not None or rows == 1:
        return 0
    return tile.rows  # a symbolic extent too: pad_einsum pads it to (n + 3) // 4 * 4


def _pad(sch: s_tir.Schedule, anchor, tile: Tile, *, columns: bool = False,
         rows: int = 0) -> bool:
    """Pad the anchor's output columns to whole ``tile`` widths, or its rows to a multiple of
    ``rows`` (``pad_einsum``): the operands read along them get zero-padded copies (a weight's
    is packed at build time), the accumulators the padded extent, and a copy block takes the
    real outputs out. Without it the tile shrank to what divides the columns (a classifier's
    1000: 8 lanes x 1 block, 100 GFLOP/s; padded to 1024, 4x4 at 220; 77 columns: no tile at
    all, TVM's default at 4 GFLOP/s), and a tail predicated inside the vector loop scalarizes
    it. False (nothing changed) where the anchor is not an einsum (a conv reads ``h + kh``)."""
    iters = sch.get(anchor).iter_vars
    spatial = [i for i, iv in enumerate(iters) if iv.iter_type == tirx.IterVar.DataPar]
    padding = [1] * len(iters)
    if columns:
        padding[spatial[-1]] = tile.blocks * tile.lanes
    extent = static_int(iters[spatial[-2]].dom.extent) if len(spatial) > 1 else None
    if rows and len(spatial) > 1 and (extent is None or extent % rows):
        padding[spatial[-2]] = rows
    if all(p == 1 for p in padding):
        return False  # the rows are whole tiles already (column padding is never a no-op)
    try:
        sch.pad_einsum(anchor, padding)
    except s_tir.ScheduleError:
        return False
    return True


def _is_crop(sch: s_tir.Schedule, block) -> bool:
    """The copy of the real columns out of padded accumulators that ``pad_einsum`` adds."""
    stmt = sch.get(block)
    return (len(stmt.reads) == 1 and len(stmt.writes) == 1
            and stmt.name_hint == stmt.reads[0].source.name)


def _pads_one_of(sch: s_tir.Schedule, block, params) -> bool:
    """``block`` is ``pad_einsum``'s zero-padded copy of one of the buffers ``params``."""
    stmt = sch.get(block)
    return (len(stmt.reads) == 1 and len(stmt.writes) == 1
            and stmt.writes[0].source.name == stmt.reads[0].source.name + "_pad"
            and any(stmt.reads[0].source.same_as(p) for p in params))


def _position(sch: s_tir.Schedule, block) -> int:
    """Where ``block`` is among the kernel's root blocks."""
    return next(i for i, b in enumerate(root_blocks(sch)) if sch.get(b).same_as(sch.get(block)))


def _feeds(sch: s_tir.Schedule, producer, consumer) -> bool:
    return any(sch.get(c).same_as(sch.get(consumer)) for c in sch.get_consumers(producer))


def _inlined(sch: s_tir.Schedule, producer) -> bool:
    try:
        sch.compute_inline(producer)
    except s_tir.ScheduleError:
        return False
    return True


def _is_plain_copy(sch: s_tir.Schedule, block) -> bool:
    """``block`` copies a buffer of its own shape element for element: the padding a conv of no
    padding still makes (an input padded beforehand, see PadConvChannels), which copied would be
    a second pass over the input."""
    stmt = sch.get(block)
    body, axes = stmt.body, [iv.var for iv in stmt.iter_vars]
    if not (isinstance(body, tirx.BufferStore) and isinstance(body.value, TensorLoad)):
        return False
    load = body.value

    def plain(indices) -> bool:
        return len(indices) == len(axes) and all(i.same_as(a) for i, a in zip(indices, axes))

    size = _elements(body.buffer)
    return (plain(body.indices) and plain(load.indices) and size is not None
            and _elements(load.source) == size)


def _padding_outweighs_output(sch: s_tir.Schedule, producer, anchor) -> bool:
    """A padding block whose buffer holds more than twice the elements of the anchor's output."""
    block = sch.get(producer)
    if not block.name_hint.startswith("pad") or len(block.writes) != 1:
        return False
    padded = _elements(block.writes[0].source.ty)
    output = _elements(sch.get(anchor).writes[0].source.ty)
    return padded is not None and output is not None and padded > 2 * output


def _elements(buffer) -> int | None:
    total = 1
    for dim in buffer.shape:
        if not isinstance(dim, tirx.IntImm):
            return None
        total *= int(dim)
    return total


def _within_groups(block, axis: tirx.Var, vector: Vector) -> Vector:
    """``vector`` with no more lanes than the output columns of one group, where an input is
    read at ``axis // group ...`` (a grouped conv's input channel): a vector spanning two groups
    reads two inputs, a gather (RegNet's 8-channel groups on 208 channels in 16 lanes: 4.8
    GFLOP/s; in 8 lanes, each a broadcast: see the benchmark in the commit). AVX-512's 8-lane
    (ymm) FMAs issue two a cycle on Zen 4, so on it nothing is lost."""
    groups = [int(node.b) for node in read_index_nodes(block)
              if isinstance(node, (tirx.FloorDiv, tirx.FloorMod))
              and isinstance(node.b, tirx.IntImm) and node.a.same_as(axis)]
    if not groups:
        return vector
    return dataclasses.replace(vector, lanes=min(vector.lanes, lanes_for(math.gcd(*groups),
                                                                         vector.lanes)))


def _is_contiguous(block, axis: tirx.Var) -> bool:
    """``axis`` indexes the innermost dimension of the output and of at least one input, so both
    are read and written as whole vectors."""

    def innermost_is_axis(region) -> bool:
        last = region.region[-1].min
        return isinstance(last, tirx.Var) and last.same_as(axis)

    return (len(block.writes) == 1 and innermost_is_axis(block.writes[0])
            and any(innermost_is_axis(r) for r in block.reads))
