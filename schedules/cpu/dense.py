"""Matmul, dense and batched matmul with a ``[..., K, N]`` right operand (linear layers after
FoldConstant has transposed their weights at build time), with the fused bias/activation/residual
epilogue: the register-blocked schedule over output columns x rows.

A transposed operand read along its reduction axis (``q @ k.T``) does not fit: the transpose
stays a separate kernel, which this rule's input then is.

:class:`DenseRowNorm` takes a GEMM whose epilogue ends in a normalization of its output rows
(``layer_norm(x @ W + b + residual)``, the ``layer_norm_epilogue`` rule): the GEMM and its
elementwise epilogue are register-blocked as above, its column tiles split across the threads,
writing the sum the normalization reads; then, in a second parallel loop of the same kernel, the
rows are normalized (mean, variance, scale) one per thread at a time. Each thread finishing whole
rows (chunks of rows, each normalized right after its GEMM) read the whole weight matrix on every
thread: with the weights coming from memory, as in a model, the column split runs 197 x 3072 x
768 + LayerNorm 1.4x as fast as row chunks.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..tir_util import inline_into_consumers, is_reduction, root_blocks
from ._blocked import Choice, block_anchor, blocked_space, choices, geometry, register_blocked
from ._tiles import choose_tile
from ._tir import CpuRule, Vector
from .reduction import lane_partials, vectorize_rows

_ANCHORS = ("matmul", "NT_matmul", "T_matmul", "T_dense", "T_batch_matmul")


class Dense(CpuRule):
    name = "cpu.dense"

    def apply(self, func, target, tunable):
        return register_blocked(func, self.vector, _is_gemm, tall=True)

    def space(self, func, target):
        return blocked_space(func, self.vector, _is_gemm, tall=True)


class DenseRowNorm(CpuRule):
    """A GEMM, its elementwise epilogue, then row reductions over its output (LayerNorm)."""

    name = "cpu.dense_row_norm"

    def apply(self, func, target, tunable):
        return self._schedule(func)

    def space(self, func, target):
        prepared = self._prepare(func)
        if prepared is None:
            return []
        sch, anchor, _, _ = prepared
        geo = geometry(sch, anchor, self.vector)
        if geo is None:
            return []
        found = [self._schedule(func, space=True)]
        found += [self._schedule(func, choice=c, space=True) for c in choices(geo, tall=True)[1:]]
        return [s for s in found if s is not None]

    def _prepare(self, func):
        """The schedule with the GEMM's elementwise epilogue inlined but its last block, and
        the GEMM's block, that epilogue block and the normalization's blocks; None where the
        kernel is not such a GEMM."""
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
        shape = sch.get(blocks[anchor]).writes[0].source.shape
        if not isinstance(shape[-2], tirx.IntImm) and not _one_column_tile(shape[-1],
                                                                           self.vector):
            # a symbolic row count over more than one tile of columns: left to the rules after
            # this one (when each thread normalized its own chunk of rows, such rows were
            # normalized before all their columns were written, relative error 0.6-0.99 from 5
            # rows on at 64 columns in AVX2 or SSE; and 7 s builds became 90-230 s)
            return None
        inline_into_consumers(sch, epilogue[:-1])
        return sch, blocks[anchor], epilogue[-1], tail

    def _schedule(self, func, choice: Choice | None = None, space: bool = False):
        """The rule's schedule of ``func`` (``choice`` and ``space`` as :func:`block_anchor`
        takes them), or None."""
        prepared = self._prepare(func)
        if prepared is None:
            return None
        sch, anchor, written, tail = prepared
        # the GEMM in its tiles, split across the threads by column tiles as cpu.dense splits
        # it, writing the sum the normalization reads; then the rows normalized in parallel
        if block_anchor(sch, anchor, self.vector, epilogue=[], written=(written,), tall=True,
                        choice=choice, space=space) is None:
            return None
        # each row normalized as RowReduction normalizes a row: the reductions' partial results
        # in vectors, their lanes folded in vectors (whole_vectors)
        partials = lane_partials(sch, tail, self.vector.lanes)
        loops = sch.get_loops(tail[-1])
        if len(loops) < 2:
            return None
        try:
            rows = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
            for block in reversed(tail[:-1]):
                sch.compute_at(block, rows)
        except (s_tir.ScheduleError, ValueError):
            return None  # not a normalization of the rows the GEMM wrote
        sch.parallel(rows)
        vectorize_rows(sch, tail, partials, self.vector.lanes)
        return sch


def _is_gemm(name: str) -> bool:
    return name.startswith(_ANCHORS)


def _one_column_tile(cols, vector: Vector) -> bool:
    """Whether every register tile :func:`block_anchor` may choose for rows of ``cols`` columns
    spans them all."""
    if not isinstance(cols, tirx.IntImm):
        return False
    tiles = [choose_tile(None, int(cols), vector, pad=pad, tall=True) for pad in (False, True)]
    return all(t is None or t.blocks * t.lanes >= int(cols) for t in tiles)
