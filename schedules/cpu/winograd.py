"""The two transforms of a Winograd F(2x2, 3x3) conv (see tvmfuse/passes/winograd_conv2d.py):
the loops over the 16 tile positions (input) and over the 2x2 outputs of a tile (output) are
unrolled, innermost but for the vector of channels, so that each case's chain of selects folds to
its adds and subtracts and each tile's values are loaded once for all of them.

    parallel for (tile, channel block):          # input: V[e, tile, c] = (B^T d B)[e]
        for e in 16 (unrolled):  V[e, tile, c:c+lanes] = +-d[..] +-d[..] ...   (4 terms)
    parallel for (tile, channel block):          # output: Y = A^T M A, then the epilogue
        for dy, dx in 2x2 (unrolled):  Y[2ty+dy, 2tx+dx, c:c+lanes] = act(+-M[..] ... + bias)

Their generic schedule (the elementwise rule: one fused loop over the output) left every select
chain to run per element: ResNet-50's 56x56x64 input transform took 0.23 ms, more than the
batched matmul after it.

Channels that no vector of 4 divides (77) keep full vectors: the channel loop goes innermost,
under the unrolled positions, as whole vectors and a tail in narrower ones
(:func:`~._tir.vectorize_inner`); each position then loads its own terms. As one lane at a
time, a 3x3 77 -> 77 conv on 28x28 spent 124 of its 344 us in the two transforms, where 64 and
80 channels spent 15 and 21.
"""

from __future__ import annotations

from tvm import s_tir

from tvmfuse.names import WINOGRAD_INPUT, WINOGRAD_OUTPUT

from ..tir_util import inline_into_consumers, lanes_for, root_blocks, static_extent
from ._tir import CpuRule, vectorize_inner

#: The block names of the two transforms (WinogradConv2D names its TE computes with these).


class WinogradTransform(CpuRule):
    name = "cpu.winograd_transform"

    def apply(self, func, target, tunable):
        sch = s_tir.Schedule(func)
        names = [sch.get(b).name_hint for b in root_blocks(sch)]
        if names == [WINOGRAD_INPUT]:
            return self._input(sch)
        if names and names[0] == WINOGRAD_OUTPUT:
            return self._output(sch)
        return None

    def _input(self, sch: s_tir.Schedule):
        (block,) = root_blocks(sch)
        e, tile, channel = sch.get_loops(block)
        lanes = lanes_for(static_extent(sch, channel), self.vector.lanes)
        if lanes < 4:  # whole vectors and a narrower tail, under the positions
            sch.reorder(tile, e, channel)
            sch.parallel(tile)
            sch.unroll(e)
            vectorize_inner(sch, channel, self.vector.lanes)
            return sch
        channel_block, lane = sch.split(channel, [None, lanes])
        sch.reorder(tile, channel_block, e, lane)
        sch.parallel(sch.fuse(tile, channel_block))
        sch.unroll(e)
        sch.vectorize(lane)
        return sch

    def _output(self, sch: s_tir.Schedule):
        blocks = root_blocks(sch)
        if not all(_elementwise(sch.get(a), sch.get(b)) for a, b in zip(blocks, blocks[1:])):
            return None  # an epilogue that moves elements (a layout transpose to NCHW)
        (block,) = inline_into_consumers(sch, blocks)  # the epilogue's last block
        batch, y, x, channel = sch.get_loops(block)
        if static_extent(sch, y) % 2 or static_extent(sch, x) % 2:
            return None  # a cropped odd edge: the elementwise rule's plain loops
        ty, dy = sch.split(y, [None, 2])
        tx, dx = sch.split(x, [None, 2])
        lanes = lanes_for(static_extent(sch, channel), self.vector.lanes)
        if lanes < 4:  # whole vectors and a narrower tail, under the outputs of a tile
            sch.reorder(batch, ty, tx, dy, dx, channel)
            sch.parallel(sch.fuse(batch, ty, tx))
            sch.unroll(dy)
            sch.unroll(dx)
            vectorize_inner(sch, channel, self.vector.lanes)
            return sch
        channel_block, lane = sch.split(channel, [None, lanes])
        sch.reorder(batch, ty, tx, channel_block, dy, dx, lane)
        sch.parallel(sch.fuse(batch, ty, tx, channel_block))
        sch.unroll(dy)
        sch.unroll(dx)
        sch.vectorize(lane)
        return sch


def _elementwise(producer, consumer) -> bool:
    """``consumer`` reads what ``producer`` writes at the element it writes itself."""
    (written,) = producer.writes
    (output,) = consumer.writes
    same = [r for r in consumer.reads if r.source.same_as(written.source)]
    return (len(same) == 1 and len(same[0].region) == len(output.region)
            and all(a.min.same_as(b.min) for a, b in zip(same[0].region, output.region)))
