"""Elementwise and other injective kernels (what FuseOps grouped: adds, activations, transposes,
reshapes, gathers), and the catch-all that gives any other kernel's loop nests threads."""

from __future__ import annotations

from tvm import s_tir

from ..tir_util import inline_into_consumers, is_reduction, root_blocks
from ._tir import CpuRule, parallelize


class Elementwise(CpuRule):
    """A kernel without reductions: its intermediates are inlined into the outputs, and each
    output loop nest runs in parallel with its innermost loop vectorized."""

    name = "cpu.elementwise"

    def apply(self, func, target, tunable):
        sch = s_tir.Schedule(func)
        blocks = root_blocks(sch)
        if not blocks or any(is_reduction(sch, b) for b in blocks):
            return None
        for block in inline_into_consumers(sch, blocks):
            parallelize(sch, block, self.vector.lanes)
        return sch


class Parallel(CpuRule):
    """The catch-all: each loop nest's leading spatial loops run on the thread pool."""

    name = "cpu.parallel"

    def apply(self, func, target, tunable):
        sch = s_tir.Schedule(func)
        for block in root_blocks(sch):
            try:
                parallelize(sch, block, self.vector.lanes)
            except s_tir.ScheduleError:
                continue  # this nest stays serial
        return sch
