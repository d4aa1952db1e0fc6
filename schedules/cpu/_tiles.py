"""Which register tile a blocked reduction takes (:mod:`._blocked` applies it): a tile of ``rows``
x ``blocks`` vectors of accumulators, chosen by a score of the FMA peak it is expected to reach
(:func:`tile_score`) among those that fit the register file, pad the output least and keep a
GEMM's weight panel in the L2. The weights of the score were fitted per register file and core
with ``benchmarks/kernel_bench.py dense --tiles ...`` (one tile forced per build).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..tir_util import lanes_for
from ._tir import Vector


@dataclass(frozen=True)
class Tile:
    """Register tile: ``rows`` x ``blocks`` vectors of ``lanes``."""

    rows: int
    blocks: int
    lanes: int


#: How fast a tile of ``blocks`` column vectors runs relative to four, per accumulator: fewer
#: blocks broadcast more inputs per FMA (16 x 1 is slowest), and the odd widths (3, 5, 7) fit
#: narrow outputs with less padding at no loss per real column
#: (``benchmarks/kernel_bench.py dense --sizes 77,100,197,1000 --tiles 4x4,8x2,16x1,5x3,3x5``).
BLOCK_EFFICIENCY = {4: 1.0, 2: 0.8, 1: 0.6, 3: 1.0, 5: 1.05, 7: 1.02}
#: The same for a GEMM's tiles in a file of 16 registers (AVX2, SSE), where the weights of four
#: blocks leave room for only two rows: two blocks (6 x 2) are best, four are never chosen.
#: Convs keep the half-file tiles: six-row tiles fill a 7- or 14-column map's rows badly
#: (``kernel_bench.py dense --tiles auto,2x4,4x3,6x2`` on an AVX2 host; whole models for convs).
BLOCK_EFFICIENCY_16 = {2: 1.0, 3: 0.95, 4: 0.85, 1: 0.6}
#: Accumulators a tile of this many blocks may hold beyond half the register file.
WIDE_ROWS = {7: 8}
#: What a GEMM's tile in 16 registers loses for holding fewer than its 12 accumulators: the share
#: it holds, to this power. Small, because a shorter tile that pads fewer rows is worth almost as
#: much (49 rows: 5 x 2, not 6 x 2 over 54; 60 rows stay 6 x 2); linear, six rows won wherever
#: they padded less than a sixth (``kernel_bench.py dense --rows 49 --tiles 4x2,5x2,6x2``, and
#: ``--rows`` 50, 60).
FILL_EXPONENT_16 = 0.15
#: What a GEMM's tile in 32 registers loses where the rows are padded to whole tiles, beyond the
#: padded rows' own share: the padded input copy and predicated output cost more than the empty
#: rows (50 rows run faster in 5 x 3 than in 4 x 4 over 52; rows every candidate pads, such as
#: 197 and 61, keep their choice; ``kernel_bench.py dense --rows 50 --tiles 4x4,5x3``).
PADDED_ROWS_32 = 0.9

#: Bytes of L2 a GEMM tile's weight panel and input rows may fill (7/8 of :func:`panel_budget`).
#: A budget, not the L2's size: SPILLED_PANEL was fitted with 1 MiB on cores of 1 MiB L2, and
#: the same 1 MiB keeps the tiles chosen on cores of 512 KiB (AVX2's narrower panels) and 2 MiB;
#: only a core with more than 2 MiB of L2 gives the panel more (half of it).
PANEL_BUDGET_BYTES = 1 << 20
#: What a GEMM's tile keeps of its rate when its weight panel (the reduction's depth x the
#: tile's columns) and its input rows do not fit in the panel budget: each row tile reads the
#: panel from L3 again (197 x 3072 x 768: the 3 x 7 tile's 1.4 MiB panel runs at about 0.7 of
#: 4 x 4's; ``kernel_bench.py dense --depth 3072 --sizes 768 --tiles 3x7,4x4,8x2``).
SPILLED_PANEL = 0.7


def panel_budget(vector: Vector) -> int:
    """Bytes of L2 a GEMM tile's weight panel may take on ``vector``'s core: half its L2, and at
    least PANEL_BUDGET_BYTES (1 MiB on every core of up to 2 MiB L2)."""
    return max(PANEL_BUDGET_BYTES, vector.l2_bytes // 2)


def _panel_fits(tile: Tile, depth: int, vector: Vector) -> bool:
    return depth * 4 * (tile.blocks * tile.lanes + tile.rows) <= panel_budget(vector) * 7 // 8


def accumulator_budget(vector: Vector, tall: bool = False) -> int:
    """How many of the register file's vectors a tile's accumulators may take: half (a 3x3 conv
    runs as fast in 4 x 1 tiles as in 8 x 2, 4 x 4 or 14 x 2: more buys nothing), or for a
    ``tall`` tile (a GEMM's) in 16 registers 12 of them, two blocks of weights and a broadcast
    beside them (see BLOCK_EFFICIENCY_16)."""
    if tall and vector.registers < 32:
        return vector.registers * 3 // 4
    return vector.registers // 2


#: BLOCK_EFFICIENCY for a GEMM's tiles on cores whose 512-bit FMAs run at full width (the others
#: split each into two 256-bit halves): there two-block tiles (8 x 2) are as fast as 4 x 4 or
#: faster and the padded 3 x 7 slower (``kernel_bench.py dense --rows 197 --sizes 768,2304,3072
#: --tiles auto,8x2,4x4,5x3,6x2,3x7``).
BLOCK_EFFICIENCY_FULL_WIDTH = {2: 1.04, 4: 1.0, 3: 1.02, 5: 1.0, 7: 0.96, 1: 0.6}
#: The cores BLOCK_EFFICIENCY_FULL_WIDTH is for (LLVM's names).
FULL_WIDTH_CORES = ("znver5",)
#: BLOCK_EFFICIENCY for a GEMM's tiles on Intel's server cores, where a two-block tile takes ten
#: rows (INTEL_WIDE_ROWS: 20 accumulators, 23 registers with its weights and broadcast) and runs
#: a few percent faster than 5 x 3 or 4 x 4; tiles wider than four blocks run slower than 4 x 4
#: (``kernel_bench.py dense --rows R --depth K --sizes N --tiles auto,10x2,4x4,5x3,3x7``).
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
    register file; at most half of it holds accumulators (:func:`accumulator_budget`). Rows
    need not divide, and may be symbolic (``None``: a full tile): a GEMM's are padded to whole
    tiles (:func:`._blocked._row_multiple`), a conv's last row tile is predicated. Columns must
    divide unless ``pad``: then they are padded to whole tiles of full vectors (see
    :func:`._blocked._pad`).
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
        # symbolic rows: a full tile; seven blocks take three rows (WIDE_ROWS: 21 accumulators,
        # with the 7 weights and the broadcast 29 registers of 32), faster than 2 x 7 on 100 or
        # 197 columns (``kernel_bench.py dense --sizes 100,197 --tiles 3x7,2x7,3x5``)
        rows = min((budget + _wide_rows(vector, tall).get(blocks, 0)) // blocks,
                   rows_extent or budget)
        if rows * blocks + blocks + 1 > vector.registers:  # (AVX2's 16 registers)
            rows = min(budget // blocks, rows_extent or budget)
        if rows * blocks + blocks + 1 > vector.registers:
            continue
        if rows == 1 and blocks > 1 and (rows_extent is None or rows_extent > 1):
            # one row of several blocks (5 or 7 fit no more in 16 registers) uses each weight
            # vector once: a 1x1 conv on a 7x7 map runs far slower in 1 x 5 tiles than in 7 x 1;
            # taken only where the output has one row
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


#: A conv's rows are not padded (see :func:`._blocked._pad`), so a tile that does not divide
#: them is predicated, which LLVM pays for in every tile (RegNet's 1x1 conv 104 -> 104 on 28x28
#: ran twice as fast in 7 x 1 tiles as in 8 x 1). A tile takes the largest row count that
#: divides the rows where that keeps at least this share of its rows.
DIVIDING_ROWS = 3 / 4


#: GEMMs over fewer rows than this (in 32 registers) also try the most rows under a tile's
#: that divide theirs: 49 rows (Winograd's 7x7 tiles of a 14x14 map) padded to 52 in 4 x 4 tiles
#: take a copy of the input and a predicated output, and run slower than 7 x 2, which divides
#: them (``kernel_bench.py dense --rows 49 --depth 256 --sizes 256 --tiles auto,4x4,7x2,8x2``).
#: Larger row counts keep their choice (measured per core: see BLOCK_EFFICIENCY_INTEL).
DIVIDING_GEMM_ROWS = 64

#: What a pointwise (1x1) conv's tile keeps of its rate where its last row tile is predicated,
#: beyond the rows it wastes: the predicate guards every row's loads and FMAs in the reduction.
#: ResNet-50's last two stages ran 4 x 4 tiles at 0.55-0.68 of 7 x 2's, which divides the rows;
#: 3x3 convs over 7x7 lose nothing (``tvmfuse inspect resnet50 --profile``).
PREDICATED_POINTWISE = 0.55

#: The most rows :func:`dividing_tile` gives a tile, and the share of the register file its
#: accumulators may take (a seven-row tile of three blocks: 21 of 32).
DIVIDING_TILE_ROWS = 8
DIVIDING_TILE_FILL = 3 / 4


def dividing_tile(rows_extent: int, cols_extent: int, vector: Vector, *,
                  pad: bool = False, depth: int | None = None) -> Tile | None:
    """The best-scoring tile whose rows divide ``rows_extent`` (2 to DIVIDING_TILE_ROWS of
    them), for rows that are never padded and that :func:`choose_tile`'s tile does not divide:
    merged rows (see :func:`._blocked._row_multiple`): ConvNeXt's last stage, a GEMM over 7 x 7
    = 49 rows, ran nearly twice as fast in 7 x 3 or 7 x 2 tiles as in predicated 3 x 7 ones.
    None where no such tile fits the register file."""
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


def dividing_if_better(tile: Tile, rows: int, cols: int, vector: Vector, depth: int | None, *,
                        pad: bool = False, pointwise: bool = False) -> Tile:
    """``tile``, or a tile whose rows divide a conv's ``rows`` (:func:`dividing_tile`) where that
    scores higher. A conv's last row tile is predicated, not padded: over a 5x5 map, 4 x 4 tiles
    compute 8 rows for every 5, where 5 x 4 computes 5 (ResNet-18's last stage at 160 px runs
    1.7x as fast in them). A ``pointwise`` conv (1x1) pays for the predicate far beyond the rows
    it wastes (PREDICATED_POINTWISE)."""
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
    if depth and not _panel_fits(tile, depth, vector):
        efficiency *= SPILLED_PANEL
    return efficiency * useful * filled * tile.lanes / vector.lanes
