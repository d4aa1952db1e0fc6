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
    MIN_PARALLEL_ELEMENTS, CpuRule, is_reduction, root_blocks, static_extent, vectorize_inner,
)


class RowReduction(CpuRule):
    name = "cpu.row_reduction"

    def apply(self, func, target, tunable):
        sch = s_tir.Schedule(func)
        blocks = root_blocks(sch)
        if not any(is_reduction(sch, b) for b in blocks) or is_reduction(sch, blocks[-1]):
            return None
        loops = sch.get_loops(blocks[-1])
        row = static_extent(sch, loops[-1])
        if len(loops) < 2 or not self._reduces_rows(sch, blocks, row):
            return None
        try:
            rows = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
            for block in reversed(blocks[:-1]):
                sch.compute_at(block, rows)
        except s_tir.ScheduleError:
            return None  # a reduction that is not along the rows' innermost axis
        for block in root_blocks(sch):
            if not is_reduction(sch, block):
                self._vectorize_row(sch, block)
        total = static_extent(sch, rows)
        if total is None or row is None or total * row >= MIN_PARALLEL_ELEMENTS:
            sch.parallel(rows)
        return sch

    @staticmethod
    def _reduces_rows(sch: s_tir.Schedule, blocks: list, row: int | None) -> bool:
        """Every reduction runs along its innermost loop over a whole output row (a matmul's
        reduction, over K, does not)."""
        for block in blocks:
            if not is_reduction(sch, block):
                continue
            kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
            if kinds.count(kinds[-1]) != 1 or kinds[-1] == kinds[0]:
                return False  # not exactly one reduction axis, innermost
            if static_extent(sch, sch.get_loops(block)[-1]) != row:
                return False
        return True

    def _vectorize_row(self, sch: s_tir.Schedule, block) -> None:
        loops = sch.get_loops(block)
        if len(loops) < 2:  # a per-row scalar (LayerNorm's mean): nothing to vectorize
            return
        vectorize_inner(sch, loops[-1], self.vector.lanes)
