"""PropagateNaN: every floating-point ``max``/``min`` in a lowered kernel becomes a ``select`` that
returns NaN when either operand is NaN, as PyTorch's ReLU, clamp, max-pooling and max reductions
do. Run on scheduled, lowered TIR (the end of a TIR lowering pipeline), so that tuning records,
which are keyed by the kernels before scheduling, still apply.

TVM's LLVM and CUDA code generators emit ``max(a, b)`` as ``a > b ? a : b`` and CUDA's ``fmaxf``:
both return the other operand when one is NaN, so ReLU (``max(x, 0)``) turned NaN into 0, a max
reduction kept or dropped a NaN depending on where it stood in the row, and the clamps of
``fast_exp`` and ``fast_erf`` turned NaN into a finite number (a softmax row holding NaN summed to
finite probabilities). The select keeps the operand whose NaN must survive where comparisons are
false. Against a constant, the usual case (ReLU, ReLU6, the clamps), the select is
``x < c ? c : x``, which LLVM lowers to the same one ``vmaxps`` with its operands swapped: no cost.
Between two variables (max reductions, running maxima) an ``isnan`` test is added to the
condition: one more compare per element.
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import tirx


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="PropagateNaN")
def PropagateNaN(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 - a TVM pass
    """Rewrite every floating-point Max and Min of ``func`` to propagate NaN; see the module
    docstring."""
    return tvm_ffi.structural_map(func, [(tirx.Max, _max), (tirx.Min, _min)])


def _max(node: tirx.Max) -> tirx.PrimExpr:
    if not _is_float(node):
        return node
    keep, other = _operands(node)
    return tirx.Select(_or_nan(keep < other, other), other, keep)


def _min(node: tirx.Min) -> tirx.PrimExpr:
    if not _is_float(node):
        return node
    keep, other = _operands(node)
    return tirx.Select(_or_nan(other < keep, other), other, keep)


def _is_float(node) -> bool:
    return tvm.DataType(str(node.ty)).is_float


def _operands(node) -> tuple[tirx.PrimExpr, tirx.PrimExpr]:
    """``(keep, other)``: the select returns ``keep`` where the comparison is false, so a NaN in
    ``keep`` survives by itself; ``other`` is the constant operand where there is one, so that its
    ``isnan`` test folds away."""
    return (node.b, node.a) if _constant(node.a) else (node.a, node.b)


def _constant(expr) -> bool:
    if isinstance(expr, tirx.Broadcast):
        expr = expr.value
    return isinstance(expr, tirx.FloatImm) and not math.isnan(expr.value)


def _or_nan(condition: tirx.PrimExpr, other: tirx.PrimExpr) -> tirx.PrimExpr:
    return condition if _constant(other) else tirx.Or(condition, tirx.isnan(other))
