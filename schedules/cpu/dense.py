"""Matmul, dense and batched matmul with a ``[..., K, N]`` right operand (linear layers after
FoldConstant has transposed their weights at build time), with the fused bias/activation/residual
epilogue: the register-blocked schedule over output columns x rows.

A transposed operand read along its reduction axis (``q @ k.T``) does not fit: the transpose
stays a separate kernel, which this rule's input then is.

:class:`DenseRowNorm` takes a GEMM whose epilogue ends in a normalization of its output rows
(``layer_norm(x @ W + b + residual)``, the ``layer_norm_epilogue`` rule): the GEMM and its
elementwise epilogue are register-blocked as above, writing the sum the normalization reads, then
each row is normalized (mean, variance, scale) by one thread while it is still in cache.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ._blocked import block_anchor, choose_tile, register_blocked
from ._tir import (
    CpuRule, Vector, inline_into_consumers, is_reduction, root_blocks, vectorize_inner,
)
from .reduction import lane_partials, vectorize_rows

_ANCHORS = ("matmul", "NT_matmul", "T_matmul", "T_dense", "T_batch_matmul")


class Dense(CpuRule):
    name = "cpu.dense"

    def apply(self, func, target, tunable):
        return register_blocked(func, self.vector, lambda name: name.startswith(_ANCHORS),
                                tall=True)


class DenseRowNorm(CpuRule):
    """A GEMM, its elementwise epilogue, then row reductions over its output (LayerNorm)."""

    name = "cpu.dense_row_norm"

    def apply(self, func, target, tunable):
        sch = s_tir.Schedule(func)
        blocks = root_blocks(sch)
        reductions = [i for i, b in enumerate(blocks) if is_reduction(sch, b)]
        if len(reductions) < 2 or not sch.get(blocks[reductions[0]]).name_hint.startswith(
                _ANCHORS):
            return None
        anchor, norm = reductions[0], reductions[1]
        epilogue, tail = blocks[anchor + 1:norm], blocks[norm:]
        if not epilogue or is_reduction(sch, tail[-1]):
            return None
        # the sum the normalization reads is written once, from the GEMM's tiles, and each
        # thread normalizes the rows it has just finished
        shape = sch.get(blocks[anchor]).writes[0].source.shape
        if not isinstance(shape[-2], tirx.IntImm) and not _one_column_tile(shape[-1],
                                                                           self.vector):
            # a symbolic row count over more than one tile of columns normalized rows before
            # all their columns were written (relative error 0.6-0.99 from 5 rows on, AVX2 or
            # SSE at 64 columns; 7 s builds became 90-230 s): left to the rules after this one
            return None
        inline_into_consumers(sch, epilogue[:-1])
        cores = int(target.attrs.get("num-cores", 1)) if target is not None else 1
        chunk = block_anchor(sch, blocks[anchor], self.vector, epilogue=[],
                             written=(epilogue[-1],), row_chunks=cores, tall=True)
        if chunk is None:
            return None
        # each row of the chunk normalized as RowReduction normalizes a row: the reductions'
        # partial results in vectors, their lanes folded in vectors (whole_vectors)
        partials = lane_partials(sch, tail, self.vector.lanes)
        try:
            for block in tail:  # under the chunk (a block goes there once its producers have)
                sch.reverse_compute_at(block, chunk)
        except (s_tir.ScheduleError, ValueError):
            return None  # not a normalization of the rows the GEMM wrote
        loops = sch.get_loops(tail[-1])
        inside = next(i for i, loop in enumerate(loops) if sch.get(loop).same_as(sch.get(chunk)))
        row_loops = loops[inside + 1:-1]
        if row_loops:  # then, where the rows are static, into the row, block by block
            per_row = sch.copy()
            try:
                rows = per_row.fuse(*row_loops) if len(row_loops) > 1 else row_loops[0]
                for block in reversed(tail[:-1]):
                    per_row.compute_at(block, rows)
                vectorize_rows(per_row, tail, partials, self.vector.lanes, row_depth=inside + 2)
                return per_row
            except (s_tir.ScheduleError, ValueError):
                pass
        # a symbolic row count (the chunk's last tile predicated): a pass over the chunk's rows
        # per block, the output vectorized
        vectorize_inner(sch, sch.get_loops(tail[-1])[-1], self.vector.lanes)
        return sch


def _one_column_tile(cols, vector: Vector) -> bool:
    """Whether every register tile :func:`block_anchor` may choose for rows of ``cols`` columns
    spans them all."""
    if not isinstance(cols, tirx.IntImm):
        return False
    tiles = [choose_tile(None, int(cols), vector, pad=pad, tall=True) for pad in (False, True)]
    return all(t is None or t.blocks * t.lanes >= int(cols) for t in tiles)
