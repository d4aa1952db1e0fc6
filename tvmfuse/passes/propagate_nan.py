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
condition: one more compare per element. CUDA's code generator has no vector of booleans, so on
CUDA (``vectors=False``) a vectorized max or min (fp16x8 loads in the GEMM epilogues) is left as
it is: such a kernel can still drop a NaN.

The select names an operand up to three times, and C evaluates ``||`` and ``?:`` lazily, so an
operand that is a warp shuffle (the attention kernels' running row maximum,
``max(m, shfl_xor(m, 1))``) would be shuffled only by the lanes whose comparison went one way:
a shuffle of the whole warp's mask that some lanes never reach hangs the GPU. Such an operand is
bound once (``Let``: CUDA C declares it before the statement, where every lane computes it).
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import tirx


def PropagateNaN(vectors: bool = True) -> tvm.transform.Pass:  # noqa: N802 - a TVM pass
    """Rewrite every floating-point Max and Min of a kernel to propagate NaN; see the module
    docstring. ``vectors=False`` leaves the vectorized ones (a target without boolean
    vectors)."""

    def rewrites(node) -> bool:
        dtype = tvm.DataType(str(node.ty))
        return dtype.is_float and (vectors or dtype.lanes == 1)

    def max_(node: tirx.Max) -> tirx.PrimExpr:
        if not rewrites(node):
            return node
        return _bound_once(node, lambda keep, other: tirx.Select(
            _or_nan(keep < other, other), other, keep))

    def min_(node: tirx.Min) -> tirx.PrimExpr:
        if not rewrites(node):
            return node
        return _bound_once(node, lambda keep, other: tirx.Select(
            _or_nan(other < keep, other), other, keep))

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="PropagateNaN")
    def propagate_nan(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:
        return tvm_ffi.structural_map(func, [(tirx.Max, max_), (tirx.Min, min_)])

    return propagate_nan


#: Calls every lane of a warp must make together (see the module docstring).
_WARP_COLLECTIVES = ("tirx.tvm_warp_shuffle", "tirx.tvm_warp_shuffle_xor",
                     "tirx.tvm_warp_shuffle_up", "tirx.tvm_warp_shuffle_down")


def _bound_once(node, select) -> tirx.PrimExpr:
    """``select(keep, other)`` over ``node``'s operands, each operand that holds a warp
    collective bound to a variable first, so that it is evaluated once, by every lane."""
    operands, bindings = [], []
    for name, operand in zip(("nan_keep", "nan_other"), _operands(node)):
        if _has_warp_collective(operand):
            var = tirx.Var(name, operand.ty)
            bindings.append((var, operand))
            operand = var
        operands.append(operand)
    result = select(*operands)
    for var, value in reversed(bindings):
        result = tirx.Let(var, value, result)
    return result


def _has_warp_collective(expr) -> bool:
    def call(node: tvm.ir.Call, visitor):
        if getattr(node.op, "name", "") in _WARP_COLLECTIVES:
            return tvm_ffi.VisitInterrupt()
        return visitor.default_visit(node)

    return tvm_ffi.structural_visit(expr, [(tvm.ir.Call, call)]) is not None


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
    if _constant(other):
        return condition
    dtype = tvm.DataType(str(other.ty))
    if dtype.bits < 32:  # CUDA has no isnan of bfloat16: test the (exact) float32 value
        other = tirx.Cast(f"float32x{dtype.lanes}" if dtype.lanes > 1 else "float32", other)
    return tirx.Or(condition, tirx.isnan(other))
