"""Row-wise reductions with their elementwise neighbours: softmax (max, exp, sum, divide),
LayerNorm (mean, variance, normalize) and the like, where every reduction runs along the
innermost axis of the output's rows.

One row at a time per thread: every block of the kernel is computed inside the loop over rows,
so a row's intermediates (its max, its exponentials, its sums) stay in cache, and the elementwise
loops over the row are vectorized.
"""

from __future__ import annotations

from tvm import s_tir

from tvmfuse.names import ROW_COMBINE, ROW_PARTIALS, ROW_TAIL

from ._tir import (
    MIN_PARALLEL_ELEMENTS, CpuRule, is_reduction, root_blocks, static_extent, uses,
    vectorize_inner,
)


class RowReduction(CpuRule):
    name = "cpu.row_reduction"

    def apply(self, func, target, tunable):
        sch = s_tir.Schedule(func)
        blocks = root_blocks(sch)
        if not any(is_reduction(sch, b) for b in blocks):
            return None
        return sch if schedule_rows(sch, blocks, self.vector.lanes) else None


def schedule_rows(sch: s_tir.Schedule, blocks: list, lanes: int) -> bool:
    """Compute ``blocks`` (the last one elementwise, the others reducing along the rows of its
    output) one row at a time per thread, the elementwise loops vectorized and the reductions
    as vectors of partial results; False when they are not such row reductions. ``sch`` may be
    changed even then: callers pass a fresh schedule."""
    if is_reduction(sch, blocks[-1]):
        return False
    loops = sch.get_loops(blocks[-1])
    row = static_extent(sch, loops[-1])
    if len(loops) < 2 or not _reduces_rows(sch, blocks, row, lanes):
        return False
    # partial results first: rfactor refuses a block that compute_at has moved
    partials = [p for p in (_vector_partials(sch, b, lanes) for b in blocks
                            if is_reduction(sch, b)) if p is not None]
    try:
        rows = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        for block in reversed(root_blocks(sch)[:-1]):
            sch.compute_at(block, rows)
    except s_tir.ScheduleError:
        return False  # a reduction that is not along the rows' innermost axis
    total = static_extent(sch, rows)
    if total is None or row is None or total * row >= MIN_PARALLEL_ELEMENTS:
        sch.parallel(rows)  # before the partial results' init is split off (parallel refuses)
    vectorize_rows(sch, blocks, partials, lanes)
    return True


def lane_partials(sch: s_tir.Schedule, blocks: list, lanes: int) -> list:
    """The reductions of ``blocks`` written as partial results already
    (``tvmfuse.strategy.whole_vectors``), for :func:`vectorize_rows`; before they are moved."""
    return [(b, _accumulators(sch, b)) for b in blocks
            if is_reduction(sch, b) and _in_lanes(sch, b, lanes)]


def vectorize_rows(sch: s_tir.Schedule, blocks: list, partials: list, lanes: int,
                   row_depth: int = 1) -> None:
    """Vectorize ``blocks``, computed one row at a time under ``row_depth`` loops (the row loop
    the innermost): the elementwise loops along the row, and the ``partials`` (pairs of a block
    and its vector accumulators) a step of one vector per accumulator along the row, their
    initialization split off."""
    combines = [b for b in blocks
                if _combines(sch, b) and int(sch.get(b).annotations[ROW_COMBINE])]
    for block in blocks:
        if not is_reduction(sch, block) and len(sch.get_loops(block)) > row_depth:
            vectorize_inner(sch, sch.get_loops(block)[-1], lanes)  # not a per-row scalar
    for block, accumulators in partials:
        if accumulators > 1:  # (a loop of one is gone once the block is moved)
            accumulator, lane, steps = sch.get_loops(block)[-3:]
            sch.reorder(steps, accumulator, lane)
            sch.unroll(accumulator)
        else:
            lane, steps = sch.get_loops(block)[-2:]
            sch.reorder(steps, lane)
        sch.vectorize(lane)
        masked = ROW_TAIL in sch.get(block).annotations
        init = sch.decompose_reduction(block, steps)
        sch.vectorize(sch.get_loops(init)[-1])
        extent = static_extent(sch, steps)
        if masked and extent is not None and extent > 1:
            # only the last step reads the row's last vector and masks lanes: the others,
            # apart, are plain loads and adds (197 x 1000 LayerNorm on Zen 4: 37 -> 22 us)
            sch.loop_partition(steps, [extent - 1, None])
    for block in combines:  # the accumulators combined a vector at a time
        lane, position = sch.get_loops(block)[-2:]
        sch.reorder(position, lane)
        sch.vectorize(lane)
        init = sch.decompose_reduction(block, position)
        sch.vectorize(sch.get_loops(init)[-1])


def _vector_partials(sch: s_tir.Schedule, block, lanes: int):
    """Split the row reduction ``block`` into ``lanes`` partial results (``rfactor``), to be
    computed one vector operation a step, then reduced across the lanes: a serial chain of 768
    scalar adds (LayerNorm's mean, then its variance) took 0.16 ms per 197-row LayerNorm on
    Zen 4. A reduction written as partial results already (``tvmfuse.strategy.whole_vectors``:
    the lanes spatial, the steps along the row reduced) is its own. Returns the partial-results
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
