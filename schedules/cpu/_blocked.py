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

The tile's shape is chosen in :mod:`._tiles`; this module applies it. The weights, when they are
constants, are read from panels packed at build time (see :func:`pack_panels`):
``w[k, b*lanes:(b+1)*lanes]`` above is then ``P[tile, k, b*lanes:...]``, each step's vectors
next to the last step's instead of a row of ``W`` apart.

Producers (padding, a transpose, a concatenation) stay separate loop nests, run in parallel, and
what feeds them (a strided slice into a concatenation) is inlined into them: inlining a padding
test into the innermost loop halved the speed of a 3x3 conv, and more than halved ResNet-50's
stride-2 3x3 convs. The exception is a strided depthwise conv, whose padded input is more than
twice the size of its output and is read as whole vectors: there, copying it costs more than the
tests (MobileNetV2's on 112x112x96 runs in half the time without the copy).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad  # a BufferLoad (tirx.BufferLoad is a constructor)

from tvmfuse.names import LAYOUT_FREE_BUFFERS, LAYOUT_REWRITE_PREPROC, PART_TAIL, PREPACK

from ..tir_util import (
    inline_into_consumers,
    is_reduction,
    lanes_for,
    loops_match_iters,
    read_index_nodes,
    root_blocks,
    static_extent,
    static_int,
    uses,
)
from . import bf16_dot, int8_dot
from ._tiles import Tile, choose_tile, dividing_if_better, dividing_tile, tile_score
from ._tir import Vector, parallelize


def anchor_of(sch: s_tir.Schedule):
    """The kernel's only reduction block, or None."""
    reductions = [b for b in root_blocks(sch) if is_reduction(sch, b)]
    return reductions[0] if len(reductions) == 1 else None


#: The most column tiles a depthwise conv's threads split by rows (``rows_outer``). With the
#: column tiles outermost each thread writes part of every pixel's channels, and a 28x28 conv
#: over two to three tiles (72-144 channels) ran slower on two threads than on one; rows
#: outermost it ran twice as fast. Over six tiles (480, 672 channels) rows outermost ran no
#: faster (``tvmfuse inspect mobilenet_v2 --profile``).
ROWS_OUTER_TILES = 4


@dataclasses.dataclass(frozen=True)
class Choice:
    """One point of the blocked schedule's design space: the register ``tile``, the columns
    padded to whole tiles (``pad_columns``: the weights packed padded, the output cropped), and
    for a rule that may split rows across the threads (``rows_outer``), whether it does (None:
    the rule's default, see ROWS_OUTER_TILES)."""

    tile: Tile
    pad_columns: bool = False
    rows_outer: bool | None = None


@dataclasses.dataclass(frozen=True)
class Geometry:
    """What the choice of a tile depends on: the anchor's output ``rows`` (merged rows counted
    whole; None where symbolic) and ``cols``, its reduction ``depth``, the ``merged`` row axes
    (:func:`_row_axes`), whether it is a ``pointwise`` (1x1) conv, the ``vector`` unit (its lanes
    within a group, :func:`_within_groups`), whether its weights may be padded, and whether,
    short of any tile, the activation it reads along the columns may (:func:`_pads_operand`)."""

    rows: int | None
    cols: int
    depth: int | None
    merged: range | None
    pointwise: bool
    vector: Vector
    pads_weights: bool
    pads_operand: bool = False


def register_blocked(func: tirx.PrimFunc, vector: Vector, claims: Callable[[str], bool], *,
                     inline_large_padding: bool = False, tall: bool = False,
                     rows_outer: bool = False, choice: Choice | None = None,
                     space: bool = False):
    """Schedule ``func`` as a register-blocked reduction, or return None when it is not one
    or its anchor block is not one the caller ``claims`` (by block name).

    ``inline_large_padding`` reads through a padding more than twice the output's size instead
    of copying it (see the module docstring; it pays only where the input is read as vectors).
    ``rows_outer``: the threads split the rows, not the column tiles (see :func:`block_anchor`).
    ``choice`` forces a point of the design space (:func:`choices`), ``space`` samples the
    unrolling of the reduction (see :func:`block_anchor`).
    """
    sch = s_tir.Schedule(func)
    anchor = anchor_of(sch)
    if anchor is None or not claims(sch.get(anchor).name_hint):
        return None
    blocks = root_blocks(sch)
    if block_anchor(sch, anchor, vector, epilogue=blocks[_position(sch, anchor) + 1:],
                    inline_large_padding=inline_large_padding, tall=tall,
                    rows_outer=rows_outer, choice=choice, space=space) is None:
        return None
    return sch


def blocked_space(func: tirx.PrimFunc, vector: Vector, claims: Callable[[str], bool],
                  **options) -> list[s_tir.Schedule]:
    """The design space of :func:`register_blocked` over ``func`` (same ``options``): one
    schedule per :func:`choices` point, each with the sampled unrolling of its reduction, the
    untuned schedule's choice first; [] where the blocked schedule does not take ``func``."""
    sch = s_tir.Schedule(func)
    anchor = anchor_of(sch)
    if anchor is None or not claims(sch.get(anchor).name_hint):
        return []
    geo = geometry(sch, anchor, vector)
    if geo is None:
        return []
    points = choices(geo, options.get("tall", False), options.get("rows_outer", False))
    space = [register_blocked(func, vector, claims, space=True, **options)]
    space += [register_blocked(func, vector, claims, choice=choice, space=True, **options)
              for choice in points[1:]]
    return [s for s in space if s is not None]


def geometry(sch: s_tir.Schedule, anchor, vector: Vector) -> Geometry | None:
    """The anchor's :class:`Geometry`, or None where the blocked schedule does not fit it."""
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
    return Geometry(rows, cols, depth, merged, pointwise, vector, _pads_weights(sch, anchor),
                    _pads_operand(rows, reduce, merged))


def default_choice(geo: Geometry, tall: bool = False) -> tuple[Choice, Tile | None] | None:
    """The tile the rule takes untuned, by :func:`._tiles.tile_score`, and the unpadded tile to
    fall back on where padding the columns turns out impossible; None where no tile fits."""
    rows, cols, vector, depth, merged = geo.rows, geo.cols, geo.vector, geo.depth, geo.merged
    pointwise = geo.pointwise
    tile = choose_tile(rows, cols, vector, tall=tall, depth=depth)
    undivided = merged is not None and tile is not None and rows % tile.rows != 0
    if undivided:
        # merged rows stay predicated (see _row_multiple): a tile that does not divide them
        # keeps every tile's accumulators in memory (ConvNeXt's 3136/784/196-row GEMMs in six-row
        # AVX2 tiles ran the model almost twice as slow); the half-file tile divides those, and
        # rows it does not divide either (49) take a tile whose rows do
        tall = False
        tile = choose_tile(rows, cols, vector)
        if rows % tile.rows:
            tile = dividing_tile(rows, cols, vector, depth=depth) or tile
    elif merged is None and not tall and tile is not None and rows % tile.rows:
        tile = dividing_if_better(tile, rows, cols, vector, depth, pointwise=pointwise)
    padded = choose_tile(rows, cols, vector, pad=True, tall=tall, depth=depth)
    if undivided and padded is not None and rows % padded.rows:
        padded = dividing_tile(rows, cols, vector, pad=True, depth=depth)
    elif merged is None and not tall and padded is not None and rows % padded.rows:
        padded = dividing_if_better(padded, rows, cols, vector, depth, pad=True,
                                     pointwise=pointwise)
    # a column tail, or columns no large tile divides: whole tiles over padded columns; and the
    # rows in whole tiles (see _row_multiple)
    better = padded is not None and (tile is None or (
        tile_score(padded, rows, cols, vector, tall, depth)
        > tile_score(tile, rows, cols, vector, tall, depth)))
    if better and geo.pads_weights:
        return Choice(padded, pad_columns=True), tile
    if tile is None and padded is not None and geo.pads_operand:
        return Choice(padded, pad_columns=True), None
    return (Choice(tile), tile) if tile is not None else None


#: The most register tiles a blocked kernel's design space holds beside its default: the best
#: by :func:`._tiles.tile_score` (with the spilled panel's penalty, without the CPU-kind tables).
SPACE_TILES = 7


def choices(geo: Geometry, tall: bool = False, rows_outer: bool = False) -> list[Choice]:
    """The design space of the blocked schedule over ``geo``: the default choice first, then
    the SPACE_TILES register tiles of the best score that fit the register file (columns
    padded to whole tiles too, where the weights may be), and, for a rule that may split rows
    across the threads (``rows_outer``), each order of the threads' loops."""
    found = default_choice(geo, tall)
    if found is None:
        return []
    default, _ = found
    vector, registers = geo.vector, geo.vector.registers
    others = []
    for pad in (False, True) if geo.pads_weights else (False,):
        lanes = vector.lanes if pad else lanes_for(geo.cols, vector.lanes)
        if min(lanes, geo.cols) < min(4, vector.lanes) or (not pad and geo.cols % lanes):
            continue
        for blocks in range(1, 9):
            if (not pad and (geo.cols // lanes) % blocks
                    or pad and geo.cols % (blocks * lanes) == 0):
                continue  # unpadded, the tile must divide the columns; padded, it does not
            for rows in range(1, registers):
                if rows * blocks + blocks + 1 > registers or (geo.rows and rows > geo.rows):
                    break
                if rows * blocks * 4 < registers:
                    continue  # too few accumulators to hide the FMA latency
                others.append(Choice(Tile(rows, blocks, lanes), pad_columns=pad))
    others.sort(key=lambda c: -tile_score(c.tile, geo.rows, geo.cols, vector, tall, geo.depth))
    space = [default] + [c for c in others if c.tile != default.tile][:SPACE_TILES]
    if rows_outer:
        space += [dataclasses.replace(c, rows_outer=order) for c in space[:1]
                  for order in (True, False)]
    return space


def block_anchor(sch: s_tir.Schedule, anchor, vector: Vector, *, epilogue: list,
                 written: tuple = (), inline_large_padding: bool = False,
                 tall: bool = False, rows_outer: bool = False, choice: Choice | None = None,
                 space: bool = False):
    """Register-block the reduction ``anchor`` of ``sch`` in place; returns the parallel loop
    its tiles run under, or None (``sch`` untouched) when it does not fit.

    The blocks before it are its producers; of ``epilogue``, the blocks after it, those that can
    be are inlined and the others are written from the tile, as are the ``written`` blocks (an
    intermediate that later blocks of the kernel read, which inlining would compute again).

    ``rows_outer`` puts the row tiles outside the column tiles in the parallel loop where the
    columns are at most ROWS_OUTER_TILES tiles, for a kernel whose weights are not reused across
    rows (a depthwise conv); see ROWS_OUTER_TILES.

    ``choice`` forces the tile (a point of :func:`choices`; None where it does not apply);
    without it the tile is :func:`default_choice`'s. ``space`` makes the schedule a point of a
    design space for the search (``tvmfuse tune``): the innermost reduction loop is split by a
    sampled factor and its inner part unrolled (on a conv, the input channels are blocked around
    the kernel window by another), and weight packing is annotated PREPACK; the sampled
    decisions' defaults leave the loops as the untuned schedule has them.
    """
    geo = geometry(sch, anchor, vector)
    if geo is None:
        return None
    rows, cols, vector, merged = geo.rows, geo.cols, geo.vector, geo.merged
    if choice is None:
        found = default_choice(geo, tall)
        if found is None:
            return None
        (chosen, fallback), forced = found, False
    else:
        chosen, fallback, forced = choice, None, True
        if choice.pad_columns and not (geo.pads_weights or geo.pads_operand):
            return None
    tile = chosen.tile if not chosen.pad_columns else fallback
    padded_columns = False
    if chosen.pad_columns:
        if _pad(sch, anchor, chosen.tile, columns=True,
                rows=_row_multiple(rows, chosen.tile, merged)):
            tile, padded_columns = chosen.tile, True
    else:
        if forced and (cols % tile.lanes or (cols // tile.lanes) % tile.blocks):
            return None  # columns that a forced unpadded tile does not divide
        _pad(sch, anchor, tile, rows=_row_multiple(rows, tile, merged))
    if tile is None:
        return None
    dot = _dot_instruction(sch, anchor, vector, tile)
    conv = sum(iv.iter_type != tirx.IterVar.DataPar for iv in sch.get(anchor).iter_vars) > 1
    if dot and (conv or merged is not None) and (rows is None or rows % tile.rows):
        # rows never padded (a conv's, merged ones) that the tile does not divide: a predicated
        # last tile, which tensorize cannot match; rows in a tile that divides them instead
        dividing = (None if forced or padded_columns or rows is None
                    else dividing_tile(rows, cols, vector, depth=geo.depth))
        if dividing is not None and dividing.lanes == tile.lanes:
            tile = dividing
        else:
            dot = None
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
    packing = pack_panels(sch, anchor, vector_axis[-1], tile.blocks * tile.lanes,
                          key=PREPACK if space else LAYOUT_REWRITE_PREPROC,
                          group=dot.GROUP if dot else 1)
    dot = dot if packing is not None else None
    for producer in blocks[:position]:
        if {LAYOUT_REWRITE_PREPROC, PREPACK} & set(sch.get(producer).annotations):
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
        split_rows = (chosen.rows_outer if chosen.rows_outer is not None else
                      rows_outer and static_extent(sch, col_outer) <= ROWS_OUTER_TILES)
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
    if dot:
        # the innermost reduction in steps of one group (a bf16 pair, an int8 quad), each
        # group's products summed by the instruction inside the lanes' loop
        steps, group = sch.split(reduce[-1], [None, dot.GROUP])
        sch.reorder(steps, *inner, group)
        reduce = [*reduce[:-1], steps]
    if space:
        reduce = _sample_reduction(sch, reduce)
    tiles = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    sch.parallel(tiles)
    for loop in inner[:-1]:
        sch.unroll(loop)
    if not dot:
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
            if columns > tile.lanes and not dot:
                sch.annotate(vectors, PART_TAIL, columns // tile.lanes)
        else:
            fused = sch.fuse(*tail) if len(tail) > 1 else tail[0]
            _, lane = sch.split(fused, [None, tile.lanes])
        sch.vectorize(lane)
    init = sch.decompose_reduction(anchor, reduce[0])
    sch.vectorize(sch.get_loops(init)[-1])
    if dot:
        sch.tensorize(inner[-1], dot.INTRIN)
        dot.link(sch, tiles)
    width = tile.blocks * tile.lanes
    if (per_column_tile and any(_columns(sch, output) % width for output in outputs)
            and not dot):
        # the last column tile writes fewer columns than it computes, under a predicate that
        # scalarized every tile's stores: its iterations run apart (tvmfuse.passes.part_tail).
        # Not a dot instruction's tile: PartTail lowers the kernel's blocks before TVM's lowering,
        # whose CompactBufferAllocation then fails on the tensorized call's vector accesses
        sch.annotate(tiles, PART_TAIL, (col_tiles - 1) * per_column_tile)
    return tiles


#: The largest inner factor the design space unrolls a reduction loop by.
UNROLL_REDUCTION = 16


def _sample_reduction(sch: s_tir.Schedule, reduce: list) -> list:
    """The design space's decisions over the reduction loops ``reduce`` (outermost first,
    directly outside the tile's loops): the innermost split by a sampled factor of at most
    UNROLL_REDUCTION, its inner part unrolled; on a conv (more than one reduction loop), the
    input channels also blocked outside the kernel window by another sampled factor. The
    default decisions (no inner part, one block) leave the loops as they were. Returns the
    reduction loops, outermost first."""
    extent = static_extent(sch, reduce[-1])
    if extent is None:
        return reduce
    if len(reduce) > 1:
        factors = sch.sample_perfect_tile(reduce[-1], n=3, max_innermost_factor=UNROLL_REDUCTION,
                                          decision=[1, extent, 1])
        block, middle, inner = sch.split(reduce[-1], factors)
        sch.reorder(block, *reduce[:-1], middle, inner)
        loops = [block, *reduce[:-1], middle, inner]
    else:
        factors = sch.sample_perfect_tile(reduce[-1], n=2, max_innermost_factor=UNROLL_REDUCTION,
                                          decision=[extent, 1])
        loops = list(sch.split(reduce[-1], factors))
    sch.unroll(loops[-1])
    return loops


def _columns(sch: s_tir.Schedule, block) -> int:
    """The columns ``block`` writes (its innermost spatial extent; 0 where symbolic)."""
    iters = [iv for iv in sch.get(block).iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    return (static_int(iters[-1].dom.extent) or 0) if iters else 0


def _row_axes(sch: s_tir.Schedule, anchor) -> range | None:
    """The anchor's spatial axes before its columns that are rows of one matrix: a matmul of
    ``[1, 14, 14, 384]`` activations (ConvNeXt's pointwise layers, in NHWC) has 196 rows, which
    :func:`_merge_rows` makes one axis, where the register tile saw rows of 14 (two of its four
    row tiles partly empty; merged, it runs a third faster). Axes qualify, from the one next
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


def pack_panels(sch: s_tir.Schedule, anchor, axis: tirx.Var, panel: int, *,
                key: str = LAYOUT_REWRITE_PREPROC, group: int = 1):
    """Read the anchor's weights in panels of ``panel`` output columns, packed at build time.

    A weight ``W[k..., n]`` that the kernel's ``layout_free_buffers`` attribute names (a
    constant: see MarkWeightsLayoutFree) and that the anchor reads at ``[reduction..., axis]``
    (or ``[batch, reduction, axis]``, a batched matmul's: Winograd's 16 products) is
    read instead from ``P[n // panel, k..., n % panel]``, written by a block annotated for
    SplitLayoutRewritePreproc, which the build moves out of the kernel to run once on the
    constant (PrepackWeights).
    Then a register tile's weights for one reduction step are one contiguous ``panel`` of floats,
    and consecutive steps are next to each other, where ``W`` has them ``N`` floats apart.
    ``key`` is the annotation (PREPACK in a design space's schedules). With a ``group`` of more
    than one (a dot instruction's, see :func:`_dot_instruction`) the innermost reduction axis is
    split in groups, each group's values next to each other in the panel:
    ``P[n // panel, ..., k // group, n % panel, k % group]``.
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
        sch.annotate(packing, key, True)
        if group > 1:
            sch.transform_layout(anchor, ("read", index), lambda *i: (
                i[-1] // panel, *i[:-2], i[-2] // group, i[-1] % panel, i[-2] % group))
        else:
            sch.transform_layout(anchor, ("read", index),
                                 lambda *i: (i[-1] // panel, *i[:-1], i[-1] % panel))
        return packing
    return None


#: The dot-product instructions a register tile may run on, each a module as :mod:`._dot` says.
DOT_INSTRUCTIONS = (bf16_dot, int8_dot)


def _dot_instruction(sch: s_tir.Schedule, anchor, vector: Vector, tile: Tile):
    """The dot-product instruction (of DOT_INSTRUCTIONS) the anchor's tile runs on, or None:
    the anchor sums products of its input and weight types into its accumulator type (float32
    sums of bf16 x bf16 in a bf16 build; int32 sums of uint8 x int8 in an int8 build), over an
    innermost reduction that the group divides, along which the input is contiguous
    (``x[..., k]``) and the weight is read as ``w[..., k, n]`` (so that :func:`pack_panels`
    packs it in groups), in tiles of the instruction's lanes, on a core that has it."""
    block = sch.get(anchor)
    store = block.body
    if not isinstance(store, tirx.BufferStore):
        return None
    value = store.value
    if not (isinstance(value, tirx.Add) and isinstance(value.b, tirx.Mul)):
        return None
    factors = (value.b.a, value.b.b)
    if not all(isinstance(f, tirx.Cast) and isinstance(f.value, TensorLoad) for f in factors):
        return None
    types = tuple(str(f.value.source.dtype) for f in factors)
    found = [dot for dot in DOT_INSTRUCTIONS
             if dot.INPUTS == types and dot.ACCUMULATOR == str(store.buffer.dtype)]
    if not found or not found[0].available(vector) or tile.lanes != found[0].LANES:
        return None
    inner = [iv for iv in block.iter_vars if iv.iter_type != tirx.IterVar.DataPar][-1]
    column = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar][-1]
    data, weight = (f.value.indices for f in factors)
    if not (data[-1].same_as(inner.var) and len(weight) >= 2 and weight[-2].same_as(inner.var)
            and weight[-1].same_as(column.var)):
        return None
    extent = static_int(inner.dom.extent)
    return found[0] if extent is not None and extent % found[0].GROUP == 0 else None


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


#: The fewest rows of a GEMM whose activation read along the output columns (no constant
#: weight) is copied, zero-padded to whole tiles, on every call where no tile divides the
#: columns: the copy is one pass over that operand, which the GEMM reads again for every row
#: tile, so at 16 rows at least two of the tallest (8-row) tiles share it. DeBERTa's attention
#: scores (12 x 93 x 64 by 64 x 93, plus its relative-position bias, 93 rows) ran at 6 GFLOP/s
#: without a tile, 128 with one (``tvmfuse inspect deberta-v2 --profile``); smaller row counts
#: were not measured.
PADDED_OPERAND_ROWS = 16


def _pads_operand(rows: int | None, reduce: list, merged) -> bool:
    """Whether a GEMM (one reduction loop, rows not merged) may pad the activation it reads
    along its columns, where no tile divides them (see PADDED_OPERAND_ROWS)."""
    return (len(reduce) == 1 and merged is None and rows is not None
            and rows >= PADDED_OPERAND_ROWS)


def _layout_free_weights(sch: s_tir.Schedule) -> list:
    """The kernel's parameters that every call passes a constant (its ``layout_free_buffers``,
    from MarkWeightsLayoutFree): the weights a schedule may lay out at build time."""
    func = sch.mod["main"]
    free = func.attrs.get(LAYOUT_FREE_BUFFERS) if func.attrs is not None else None
    return [func.params[int(i)] for i in free or ()]


def _row_multiple(rows: int | None, tile: Tile, merged) -> int:
    """What a GEMM pads its rows to a multiple of (0: not padded): whole tiles. Unpadded, the
    last tile is predicated, and LLVM keeps the accumulators of its rows that may be empty in
    memory, in every tile (50 x 768 x 768 ran a third slower than 52 x 768 x 768). Merged rows
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
    1000: 8 lanes x 1 block, half the speed of 4 x 4 over 1024; 77 columns: no tile at all, and
    TVM's default fifty times slower), and a tail predicated inside the vector loop scalarizes
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
    reads two inputs, a gather (RegNet's 8-channel groups on 208 channels in 16 lanes); in 8
    lanes each vector reads one input, a broadcast. On cores that split 512-bit FMAs into two
    halves an 8-lane (ymm) FMA issues two a cycle, so there nothing is lost."""
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
