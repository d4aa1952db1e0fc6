"""Elementwise and other injective kernels (what FuseOps grouped: adds, activations, transposes,
reshapes, gathers), and the catch-all that gives any other kernel's loop nests threads."""

from __future__ import annotations

import math

from tvm import s_tir, sym

from ..tir_util import (
    inline_into_consumers,
    is_reduction,
    loops_match_iters,
    root_blocks,
    static_extent,
    static_int,
    uses,
)
from ._tir import MIN_PARALLEL_ELEMENTS, CpuRule, parallelize


class Transpose(CpuRule):
    """A kernel that writes one input in another axis order (layout glue: NCW to NHWC around a
    GroupNorm): the two axes that are innermost in the input and in the output are tiled, so a
    tile's reads and writes both stay in cache, and the output's row of a tile is one vector.

    Looped in output order, each vector gathered its lanes from as many input rows: Wav2Vec2's
    ``[512, 3199] -> [3199, 512]`` transpose read rows 12.8 KB apart and took 4.5 ms for 6.5 MB
    (``tvmfuse inspect wav2vec2 --profile``).
    """

    name = "cpu.transpose"

    #: Tile edge in elements, the untuned choice and the others the search tries: 16 float32 are
    #: one 64-byte line, so a 16 x 16 tile reads 16 whole lines and writes 16 (1 KiB each way).
    TILES = (16, 8, 32)

    def apply(self, func, target, tunable):
        return self._schedule(func, self.TILES[0])

    def space(self, func, target):
        return [s for s in (self._schedule(func, t) for t in self.TILES) if s is not None]

    def _schedule(self, func, tile: int):
        sch = s_tir.Schedule(func)
        blocks = root_blocks(sch)
        if not blocks or any(is_reduction(sch, b) for b in blocks):
            return None
        outputs = inline_into_consumers(sch, blocks)
        if len(outputs) != 1:
            return None
        block = outputs[0]
        if not str(sch.get(block).writes[0].source.dtype).startswith(("float", "bfloat")):
            return None  # LLVM code would move a vector of bools as bits (see parallelize)
        axis = _input_inner_axis(sch, block)
        if axis is None:
            return None
        loops = sch.get_loops(block)
        across, inner = loops[axis], loops[-1]
        extents = [static_extent(sch, loop) for loop in loops]
        if None in extents or min(extents[axis], extents[-1]) < 2 * tile:
            return None
        outer = [loop for i, loop in enumerate(loops[:-1]) if i != axis]
        rows, row = sch.split(across, [None, tile])
        cols, col = sch.split(inner, [None, tile])
        sch.reorder(*outer, rows, cols, row, col)
        if extents[-1] % tile == 0:  # a partial tile's vector would run one lane at a time
            sch.vectorize(col)
        if math.prod(extents) >= MIN_PARALLEL_ELEMENTS:
            sch.parallel(sch.fuse(*outer, rows) if outer else rows)
        return sch


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


def _input_inner_axis(sch: s_tir.Schedule, block) -> int | None:
    """The loop of ``block`` (which reads one buffer, loops matching its iterators) that steps
    along the innermost axis of the buffer it reads, by its position, where that is not its own
    innermost loop; else None (an elementwise kernel, or one that reads several buffers)."""
    if not loops_match_iters(sch, block):
        return None
    stmt = sch.get(block)
    if len({region.source.name for region in stmt.reads}) != 1 or len(stmt.reads[0].region) < 2:
        return None
    analyzer = sym.Analyzer()  # a reshape's ``w // 3199`` over w < 3199 is 0
    for iv in stmt.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    last = analyzer.simplify(stmt.reads[0].region[-1].min)
    iters = [iv.var for iv in stmt.iter_vars]
    if uses(last, iters[-1]):
        return None
    found = [i for i, iv in enumerate(stmt.iter_vars[:-1])
             if uses(last, iv.var) and static_int(iv.dom.extent) != 1]
    return found[-1] if found else None
