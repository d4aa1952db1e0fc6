"""Row-wise reductions with their elementwise neighbours: softmax (max, exp, sum, divide),
LayerNorm (mean, variance, normalize) and the like, where every reduction runs along the
innermost axis of the output's rows.

One row at a time per thread: every block of the kernel is computed inside the loop over rows,
so a row's intermediates (its max, its exponentials, its sums) stay in cache, and the elementwise
loops over the row are vectorized.
"""

from __future__ import annotations

from tvm import s_tir

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
    for block in blocks:
        if not is_reduction(sch, block) and len(sch.get_loops(block)) > 1:
            vectorize_inner(sch, sch.get_loops(block)[-1], lanes)  # not a per-row scalar
    for block in partials:  # one vector of partial results a step, across the row
        lane, steps = sch.get_loops(block)[-2:]
        sch.reorder(steps, lane)
        sch.vectorize(lane)
        init = sch.decompose_reduction(block, steps)
        sch.vectorize(sch.get_loops(init)[-1])
    return True


def _vector_partials(sch: s_tir.Schedule, block, lanes: int):
    """Split the row reduction ``block`` into ``lanes`` partial results (``rfactor``), to be
    computed one vector operation a step, then reduced across the lanes: a serial chain of 768
    scalar adds (LayerNorm's mean, then its variance) took 0.16 ms per 197-row LayerNorm on
    Zen 4. A reduction already written as steps of one vector (``tvmfuse.strategy.whole_vectors``:
    rows that ``lanes`` does not divide) takes its lanes as the partial results. Returns the
    partial-results block, or None where ``lanes`` does not divide the row or the reduction is
    not one ``rfactor`` takes."""
    loop = sch.get_loops(block)[-1]
    row = static_extent(sch, loop)
    try:
        if _in_vectors(sch, block, lanes):
            inner = loop
        elif row is None or row % lanes or row < 2 * lanes:
            return None
        else:
            _, inner = sch.split(loop, [None, lanes])
        return sch.rfactor(inner, factor_axis=len(sch.get(block).writes[0].region))
    except s_tir.ScheduleError:
        return None


def _in_vectors(sch: s_tir.Schedule, block, lanes: int) -> bool:
    """``block`` reduces over two axes, steps and the ``lanes`` of one vector (innermost)."""
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    return (len(kinds) >= 3 and kinds[-1] == kinds[-2] != kinds[0]
            and kinds.count(kinds[-1]) == 2
            and static_extent(sch, sch.get_loops(block)[-1]) == lanes)


def _reduces_rows(sch: s_tir.Schedule, blocks: list, row: int | None, lanes: int) -> bool:
    """Every reduction runs along its innermost loop over a whole output row (or along its two
    innermost, steps of one vector over the row rounded up to whole vectors:
    ``tvmfuse.strategy.whole_vectors``), and reads what it reduces along that innermost axis
    only (a matmul's reduction over K reads ``B[k, j]``, even where K happens to equal the
    row's length)."""
    for block in blocks:
        if not is_reduction(sch, block):
            continue
        stmt = sch.get(block)
        kinds = [iv.iter_type for iv in stmt.iter_vars]
        extents = [static_extent(sch, loop) for loop in sch.get_loops(block)]
        if _in_vectors(sch, block, lanes):
            axes = [iv.var for iv in stmt.iter_vars[-2:]]
            if row is None or extents[-2] != -(-row // lanes):
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
