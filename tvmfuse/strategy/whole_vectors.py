"""Row reductions over rows the vector does not divide (LayerNorm over 77 or 1000 features, a
softmax over 197 keys), written so that every step of the reduction is one whole vector.

The CPU schedule (``schedules/cpu/reduction.py``) reduces a row as ``lanes`` partial results, one
vector operation a step (``rfactor``). That needs ``lanes`` to divide the row: on 197 x 1000 a
LayerNorm's two serial chains of 1000 scalar adds took 385 us on Zen 4, where 1024 columns took
55 us. ``rfactor`` of a split that does not divide loses the split's predicate (TVM 0.27: the
partial sums read past the row, relative error 2e-2 to 5e-2, measured), so the padding is
written into the computation instead: the reduction runs over the row rounded up to whole
vectors, and its last vector is the row's last ``lanes`` elements, its lanes that the vector
before already counted weighing the reduction's identity. Every load is a whole vector inside
the row (no read past it, no gather), and the schedule's partial results apply unchanged.

These are legalizations (Relax op -> TE) of ``relax.nn.layer_norm``, ``relax.nn.rms_norm`` and
``relax.nn.softmax`` over the last axis, float32, rows of at least two vectors that ``lanes``
does not divide; every other call keeps TVM's legalization.
"""

from __future__ import annotations

from tvm import relax, te, tirx, topi
from tvm.relax.transform.legalize_ops import nn as tvm_nn

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
    return row if row % lanes and row >= 2 * lanes else None


class _Row:
    """The reduction axis of one row of ``length`` as whole vectors of ``lanes``."""

    def __init__(self, length: int, lanes: int):
        self.length, self.lanes = length, lanes
        self.steps = -(-length // lanes)  # vectors, the last one overlapping its predecessor

    def reduce(self, name: str, rows: list, value, combine, identity) -> te.Tensor:
        """``combine`` over the row of ``value(index, column)`` for each of ``rows``, as two
        reduction axes, steps of one vector and its lanes (the schedule's partial results are
        the lanes: one axis split in two would leave ``(k0 * 16 + k1) // 16`` in the index,
        which TVM 0.27 vectorizes as a gather)."""
        step = te.reduce_axis((0, self.steps), f"{name}_step")
        lane = te.reduce_axis((0, self.lanes), f"{name}_lane")

        def element(*index):
            start = step * self.lanes
            # the last vector is the row's last `lanes` columns; those its predecessor counted
            # weigh the identity
            column = tirx.min(start, self.length - self.lanes) + lane
            return combine(tirx.Select(column >= start, value(index, column), identity),
                           axis=[step, lane])

        return te.compute(rows, element, name=name)


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
