"""Row-wise reductions with their elementwise neighbours: softmax (max, exp, sum, divide),
LayerNorm (mean, variance, normalize) and the like, where every reduction runs along the
innermost axis of the output's rows.

One row at a time per thread (short rows: four, ROW_GROUP): every block of the kernel is computed
inside the loop over rows, so a row's intermediates (its max, its exponentials, its sums) stay in
cache, and the elementwise loops over the row are vectorized.
"""

from __future__ import annotations

import math

from tvm import s_tir

from tvmfuse.names import PART_TAIL, ROW_COMBINE, ROW_PARTIALS, ROW_TAIL

from ..tir_util import is_reduction, root_blocks, static_extent, uses
from ._tir import CpuRule, vectorize_inner

#: Rows reduced together: each step of a row's chain of dependent operations (its partial
#: results, their combination, the lanes folded) is taken for the group's rows in turn, so that
#: their operations overlap. One row at a time, a short row's chain (loads, adds, the lanes
#: folded, a division, then the same for the variance, a square root) left the core idle: 197 x 64
#: and 197 x 77 LayerNorms run 1.4x as fast in groups of four; in groups of 8 or 16 the partial
#: results no longer fit the registers (``kernel_bench.py layer_norm --sizes 64,77``).
ROW_GROUP = 4
#: Rows of fewer vectors than this are reduced in groups of :data:`ROW_GROUP`: longer rows have
#: operations enough of their own in flight, and four of them at once ran no faster
#: (``kernel_bench.py layer_norm --sizes 197,384,768,1000,1024``).
SHORT_ROW_VECTORS = 8
#: Row reductions over fewer elements run on one thread: a parallel loop's start and join on
#: TVM's thread pool (0.7 to 2 us) costs more than half of a 197 x 77 LayerNorm, which runs
#: faster on one thread than on two; 197 x 197 gains from two.
ROW_PARALLEL_ELEMENTS = 32768


class RowReduction(CpuRule):
    name = "cpu.row_reduction"

    def apply(self, func, target, tunable):
        sch = s_tir.Schedule(func)
        blocks = root_blocks(sch)
        if not any(is_reduction(sch, b) for b in blocks):
            return None
        if schedule_rows(sch, blocks, self.vector.lanes):
            return sch
        # rows of several dimensions in groups can fail TVM's checks where a single row does
        # not (DeBERTa's 12 x 93 softmax rows, parallel: "The reduction block vars are not used
        # to index the output buffers"): one row at a time then
        sch = s_tir.Schedule(func)
        return sch if schedule_rows(sch, root_blocks(sch), self.vector.lanes, group=1) else None


def schedule_rows(sch: s_tir.Schedule, blocks: list, lanes: int,
                  group: int | None = None) -> bool:
    """Compute ``blocks`` (the last one elementwise, the others reducing along the rows of its
    output) one row at a time per thread (``group`` rows at a time; None: :func:`_row_group`'s
    choice), the elementwise loops vectorized and the reductions as vectors of partial results;
    False when they are not such row reductions. ``sch`` may be changed even then: callers pass
    a fresh schedule."""
    if is_reduction(sch, blocks[-1]):
        return False
    loops = sch.get_loops(blocks[-1])
    if len(loops) < 2:
        return False  # one row at most (a whole tensor's mean is a scalar)
    row = static_extent(sch, loops[-1])
    if not _reduces_rows(sch, blocks, row, lanes):
        return False
    # partial results first: rfactor refuses a block that compute_at has moved
    partials = [p for p in (_vector_partials(sch, b, lanes) for b in blocks
                            if is_reduction(sch, b)) if p is not None]
    group = _row_group(sch, loops, row, lanes) if group is None else group
    try:
        rows = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        total = static_extent(sch, rows)
        if group > 1:
            rows = sch.split(rows, [None, group])[0]
        for block in reversed(root_blocks(sch)[:-1]):
            sch.compute_at(block, rows)
        if total is None or row is None or total * row >= ROW_PARALLEL_ELEMENTS:
            sch.parallel(rows)  # before the partial results' init is split off (parallel refuses)
    except s_tir.ScheduleError:
        return False  # a reduction that is not along the rows' innermost axis
    vectorize_rows(sch, blocks, partials, lanes, grouped=group > 1)
    if total is not None and total % group:
        # the last group apart, the only one whose rows run past the output's
        sch.annotate(rows, PART_TAIL, total // group)
    return True


def _row_group(sch: s_tir.Schedule, loops: list, row: int | None, lanes: int) -> int:
    """How many rows :func:`schedule_rows` reduces together: :data:`ROW_GROUP` where the rows are
    short and many, else 1. Rows of several dimensions that the groups do not divide stay one at a
    time (TVM 0.27 refuses to vectorize a block under the last group's predicate on the fused
    index: "The reduction block vars are not used to index the output buffers")."""
    extents = [static_extent(sch, loop) for loop in loops[:-1]]
    if row is None or -(-row // lanes) >= SHORT_ROW_VECTORS or None in extents:
        return 1
    total = math.prod(extents)
    if total < 2 * ROW_GROUP or (total % ROW_GROUP and sum(e > 1 for e in extents) > 1):
        return 1
    return ROW_GROUP


def lane_partials(sch: s_tir.Schedule, blocks: list, lanes: int) -> list:
    """The reductions of ``blocks`` written as partial results already
    (``tvmfuse.strategy.whole_vectors``), for :func:`vectorize_rows`; before they are moved."""
    return [(b, _accumulators(sch, b)) for b in blocks
            if is_reduction(sch, b) and _in_lanes(sch, b, lanes)]


def vectorize_rows(sch: s_tir.Schedule, blocks: list, partials: list, lanes: int,
                   row_depth: int = 1, grouped: bool = False) -> None:
    """Vectorize ``blocks``, computed one row at a time under ``row_depth`` loops (the row loop
    the innermost), or a group of rows at a time (``grouped``: a loop over the group's rows
    below those): the elementwise loops along the row, and the ``partials`` (pairs of a block
    and its vector accumulators) a step of one vector per accumulator along the row, their
    initialization split off. In a group, each step of the partial results and of their
    combination is taken for every row of the group in turn (:data:`ROW_GROUP`)."""
    depth = row_depth + grouped
    combines = [b for b in blocks
                if _combines(sch, b) and int(sch.get(b).annotations[ROW_COMBINE])]
    for block in blocks:
        if not is_reduction(sch, block) and len(sch.get_loops(block)) > depth:
            vectorize_inner(sch, sch.get_loops(block)[-1], lanes)  # not a per-row scalar
    for block, accumulators in partials:
        # (a loop of one is gone once the block is moved)
        spatial = sch.get_loops(block)[depth - 1 if grouped else depth:-1]
        steps, lane = sch.get_loops(block)[-1], spatial[-1]
        sch.reorder(steps, *spatial)
        for loop in spatial[:-1]:  # the group's rows and the accumulators
            sch.unroll(loop)
        sch.vectorize(lane)
        masked = ROW_TAIL in sch.get(block).annotations
        init = sch.decompose_reduction(block, steps)
        sch.vectorize(sch.get_loops(init)[-1])
        extent = static_extent(sch, steps)
        if masked and extent is not None and extent > 1:
            # only the last step reads the row's last vector and masks lanes: the others,
            # apart, are plain loads and adds (a 197 x 1000 LayerNorm runs 1.7x as fast)
            sch.loop_partition(steps, [extent - 1, None])
    for block in combines:  # the accumulators combined a vector at a time
        *spatial, position = sch.get_loops(block)[depth - 1 if grouped else depth:]
        sch.reorder(position, *spatial)
        if grouped:
            sch.unroll(spatial[0])
        sch.vectorize(spatial[-1])
        init = sch.decompose_reduction(block, position)
        sch.vectorize(sch.get_loops(init)[-1])


def _vector_partials(sch: s_tir.Schedule, block, lanes: int):
    """Split the row reduction ``block`` into ``lanes`` partial results (``rfactor``), to be
    computed one vector operation a step, then reduced across the lanes: a serial chain of 768
    scalar adds (LayerNorm's mean, then its variance) took 0.16 ms per 197-row LayerNorm. A
    reduction written as partial results already (``tvmfuse.strategy.whole_vectors``: the lanes
    spatial, the steps along the row reduced) is its own. Returns the partial-results
    block and its vector accumulators (``rfactor``'s: 1), or None where ``lanes`` does not divide
    the row or the reduction is not one ``rfactor`` takes."""
    if _in_lanes(sch, block, lanes):
        return block, _accumulators(sch, block)
    loop = sch.get_loops(block)[-1]
    row = static_extent(sch, loop)
    if row is None or row % lanes or row < 2 * lanes:
        return None
    try:
        _, inner = sch.split(loop, [None, lanes])
        return sch.rfactor(inner, factor_axis=len(sch.get(block).writes[0].region)), 1
    except s_tir.ScheduleError:
        return None


def _accumulators(sch: s_tir.Schedule, block) -> int:
    """The vector accumulators of ``block``, a reduction :func:`_in_lanes` accepts."""
    return int(sch.get(block).annotations[ROW_PARTIALS])


def _in_lanes(sch: s_tir.Schedule, block, lanes: int) -> bool:
    """``block`` is partial results of a row reduction written in whole vectors
    (``tvmfuse.strategy.whole_vectors``): a step along the row reduced, its vector accumulators
    and ``lanes`` spatial."""
    return (ROW_PARTIALS in sch.get(block).annotations
            and static_extent(sch, sch.get_loops(block)[-2]) == lanes)


def _combines(sch: s_tir.Schedule, block) -> bool:
    """``block`` combines a few partial results of a row reduction in whole vectors."""
    return ROW_COMBINE in sch.get(block).annotations


def _reduces_rows(sch: s_tir.Schedule, blocks: list, row: int | None, lanes: int) -> bool:
    """Every reduction runs along its innermost loop over a whole output row (or, as partial
    results in ``lanes``, over the row's steps of one vector: ``tvmfuse.strategy.whole_vectors``),
    and reads what it reduces along that innermost axis only (a matmul's reduction over K reads
    ``B[k, j]``, even where K happens to equal the row's length)."""
    for block in blocks:
        if not is_reduction(sch, block) or _combines(sch, block):
            continue  # (a combination reads the partial results, never the row)
        stmt = sch.get(block)
        kinds = [iv.iter_type for iv in stmt.iter_vars]
        extents = [static_extent(sch, loop) for loop in sch.get_loops(block)]
        if _in_lanes(sch, block, lanes):
            count = _accumulators(sch, block)
            axes = [iv.var for iv in stmt.iter_vars[-3 if count > 1 else -2:]]
            if row is None or extents[-1] * count < -(-row // lanes):
                return False
        elif kinds.count(kinds[-1]) != 1 or kinds[-1] == kinds[0] or extents[-1] != row:
            return False  # not exactly one reduction axis, innermost, along the row
        else:
            axes = [stmt.iter_vars[-1].var]
        for read in stmt.reads:
            indices = [r.min for r in read.region]
            if any(uses(index, axis) for index in indices[:-1] for axis in axes):
                return False
    return True
