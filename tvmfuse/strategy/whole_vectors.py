"""Row reductions (LayerNorm, RMSNorm, softmax) written as vector operations: partial results
in a few vector accumulators, a step of one vector along the row each, then the lanes folded in
halves; at any row length (77 or 1000 features, a softmax over 197 keys, 768 as 1024).

The CPU schedule (``schedules/cpu/reduction.py``) reduced TVM's legalization as ``lanes`` partial
results (``rfactor``), which needs ``lanes`` to divide the row (on 197 x 1000 a LayerNorm's two
serial chains of 1000 scalar adds took seven times as long as 1024 columns), then
reduced the lanes in a serial chain of 16 scalar adds, twice a LayerNorm row; its one
accumulator waited on a chain of 64 dependent vector adds per pass over 1024 columns.
``rfactor`` of a split that does not divide loses the split's predicate (TVM 0.27: the partial
sums read past the row, relative error 2e-2 to 5e-2, measured), so the padding is written into
the computation instead: the reduction runs over the row rounded up to whole vectors, and its
last vector is the row's last ``lanes`` elements, its lanes that the vector before already
counted weighing the reduction's identity. Every load is a whole vector inside the row (no read
past it, no gather). 197-row LayerNorms run 1.3-1.6x as fast so as in ``rfactor``'s form, at
64, 77, 768 and 1024 columns (``benchmarks/kernel_bench.py layer_norm --sizes 64,77,768,1024``).

These are legalizations (Relax op -> TE) of ``relax.nn.layer_norm``, ``relax.nn.rms_norm`` and
``relax.nn.softmax`` over the last axis, float32, rows of at least two vectors; every other call
keeps TVM's legalization.
"""

from __future__ import annotations

from tvm import relax, te, tirx, topi
from tvm.relax.transform.legalize_ops import nn as tvm_nn

from tvmfuse import names

__all__ = ["legalizations"]


def legalizations(lanes: int) -> dict:
    """Relax op -> legalization, for vectors of ``lanes`` float32."""
    return {
        "relax.nn.layer_norm": _legalize(lanes, _layer_norm, tvm_nn._nn_layer_norm),
        "relax.nn.rms_norm": _legalize(lanes, _rms_norm, tvm_nn._nn_rms_norm),
        "relax.nn.softmax": _legalize(lanes, _softmax, tvm_nn._nn_softmax),
    }


def _legalize(lanes: int, compute, fallback):
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        x = call.args[0].ty
        row = _row_length(x, call.attrs, lanes)
        if row is None:
            return fallback(bb, call)
        return bb.call_te(lambda *args: compute(_Row(row, lanes), *args, call.attrs), *call.args,
                          primfunc_name_hint=call.op.name.split(".")[-1])

    return legalize


def _row_length(x, attrs, lanes: int) -> int | None:
    """The length of the rows ``attrs`` reduces, where this file's computations apply."""
    if x.dtype != "float32" or x.ndim < 2 or not isinstance(x.shape[-1], tirx.IntImm):
        return None
    axes = list(attrs.axes) if hasattr(attrs, "axes") else [attrs.axis]
    if [int(a) % x.ndim for a in axes] != [x.ndim - 1]:
        return None
    row = int(x.shape[-1])
    return row if row >= 2 * lanes else None


class _Row:
    """The reduction axis of one row of ``length`` as whole vectors of ``lanes``."""

    def __init__(self, length: int, lanes: int):
        self.length, self.lanes = length, lanes
        self.steps = -(-length // lanes)  # vectors, the last one overlapping its predecessor
        # independent vector accumulators: one vector add has a latency of four cycles, and a
        # LayerNorm over 1024 columns with one accumulator waits on a chain of 64 of them twice
        # a row, slower than TVM's own one pass over both sums
        self.accumulators = 4 if self.steps >= 8 else 2 if self.steps >= 4 else 1

    def reduce(self, name: str, rows: list, value, combine, identity) -> te.Tensor:
        """``combine`` (``te.sum`` or ``te.max``) over the row of ``value(index, column)`` for
        each of ``rows``: ``accumulators x lanes`` partial results, one vector operation a step
        along the row (a reduction over the steps, the accumulators and lanes spatial), the
        accumulators combined, then the lanes folded in halves, 16 -> 8 -> 4 -> 2 -> 1 (vector
        operations, a chain of four). TVM's legalization leaves that part to the schedule's
        ``rfactor``, whose reduction across the lanes is a serial chain of 16 scalar operations:
        two per LayerNorm row, 32 dependent adds.

        Each combination is a reduction over the positions it combines (annotated
        :data:`tvmfuse.names.ROW_COMBINE`), not an elementwise block reading ``v[0] + v[1]`` or
        ``v[l] + v[l + 8]``: ``reverse_compute_at`` (the GEMM + LayerNorm schedule) refuses a
        consumer that reads one buffer at a constant or at two offsets."""
        count, lanes = self.accumulators, self.lanes
        step = te.reduce_axis((0, -(-self.steps // count)), f"{name}_step")
        exact = self.length % lanes == 0 and self.steps % count == 0

        def partial(*index):
            *row, accumulator, lane = index if count > 1 else (*index[:-1], 0, index[-1])
            start = (step * count + accumulator) * lanes
            if exact:
                return combine(value(tuple(row), start + lane), axis=step)
            # the last vector is the row's last `lanes` columns; those its predecessor counted,
            # and every lane of a vector past the row's last, weigh the identity
            column = tirx.min(start, self.length - lanes) + lane
            return combine(tirx.Select(column >= start, value(tuple(row), column), identity),
                           axis=step)

        shape = [*rows, count, lanes] if count > 1 else [*rows, lanes]
        attrs = {names.ROW_PARTIALS: count, **({} if exact else {names.ROW_TAIL: 1})}
        folded = te.compute(shape, partial, name=f"{name}_lanes", attrs=attrs)
        if count > 1:
            folded = _combine(folded, combine, f"{name}_vector", shape=[*rows, lanes],
                              read=lambda v, i, k: v[(*i[:-1], k, i[-1])], extent=count,
                              vector=True)
        width = lanes // 2
        while width > 1:  # halves of the lanes, those at ``l`` and at ``l + width``
            folded = _combine(folded, combine, f"{name}_fold{width}", shape=[*rows, width],
                              read=lambda v, i, k, w=width: v[(*i[:-1], i[-1] + k * w)],
                              extent=2, vector=True)
            width //= 2
        return _combine(folded, combine, name, shape=rows, read=lambda v, i, k: v[(*i, k)],
                        extent=2, vector=False)


def _combine(values: te.Tensor, combine, name: str, *, shape: list, read, extent: int,
             vector: bool):
    """``combine`` over ``extent`` positions of ``values``: ``read(values, index, k)`` for k
    below ``extent``, a reduction annotated :data:`names.ROW_COMBINE` (1 where the innermost
    spatial axis is a vector's lanes, 0 where the result is one number a row)."""
    k = te.reduce_axis((0, extent), f"{name}_k")
    return te.compute(shape, lambda *i: combine(read(values, i, k), axis=k), name=name,
                      attrs={names.ROW_COMBINE: int(vector)})


def _rows(x: te.Tensor) -> list:
    return list(x.shape[:-1])


def _f32(value: float):
    return tirx.const(value, "float32")


def _layer_norm(row: _Row, x, gamma, beta, attrs) -> te.Tensor:
    mean = row.reduce("x_sum", _rows(x), lambda i, c: x[(*i, c)], te.sum, _f32(0))
    mean = topi.divide(mean, _f32(row.length))
    var = row.reduce("x_var_sum", _rows(x),
                     lambda i, c: (x[(*i, c)] - mean[i]) * (x[(*i, c)] - mean[i]), te.sum, _f32(0))
    eps = _f32(attrs.epsilon)
    return te.compute(x.shape, lambda *i: (x[i] - mean[i[:-1]]) * tirx.rsqrt(
        var[i[:-1]] / _f32(row.length) + eps) * gamma[i[-1]] + beta[i[-1]], name="T_layer_norm")


def _rms_norm(row: _Row, x, weight, attrs) -> te.Tensor:
    square = row.reduce("x_square_sum", _rows(x), lambda i, c: x[(*i, c)] * x[(*i, c)], te.sum,
                        _f32(0))
    eps = _f32(attrs.epsilon)
    return te.compute(x.shape, lambda *i: x[i] * tirx.rsqrt(
        square[i[:-1]] / _f32(row.length) + eps) * weight[i[-1]], name="T_rms_norm")


def _softmax(row: _Row, x, attrs) -> te.Tensor:
    peak = row.reduce("T_softmax_maxelem", _rows(x), lambda i, c: x[(*i, c)], te.max,
                      tirx.min_value("float32"))
    exp = te.compute(x.shape, lambda *i: tirx.exp(x[i] - peak[i[:-1]]), name="T_softmax_exp")
    total = row.reduce("T_softmax_expsum", _rows(x), lambda i, c: exp[(*i, c)], te.sum, _f32(0))
    return te.compute(x.shape, lambda *i: exp[i] / total[i[:-1]], name="T_softmax_norm")
