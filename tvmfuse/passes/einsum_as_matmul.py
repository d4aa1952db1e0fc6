"""EinsumAsMatmul: an ``einsum`` of two operands that is a (batched) matrix product becomes
``permute_dims``, ``reshape`` and ``matmul``, which the GEMM rules schedule.

ONNX models carry attention and projections as Einsum (CvT's ``bhlk,bhtk->bhlt``); TVM legalizes
``relax.einsum`` to one generic TE compute that no GEMM rule takes, and the row-reduction rule
made CvT's a vectorized gather that LLVM did not compile in minutes. torch.export writes the same
einsum as ``bmm`` already.

The letters of the subscripts fall in four groups: batch (in both operands and the output),
contracted (in both operands only), left (in the first operand and the output) and right (in the
second and the output). Each operand is permuted to ``batch, left, contracted`` (``batch,
contracted, right``), flattened to three axes, multiplied, and the product unflattened and
permuted to the output's order. An einsum with an ellipsis, a letter repeated in an operand (a
diagonal), or a letter summed over one operand only is left as it is.

Preconditions: imported Relax (operands of known rank).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ._rewrite import rewrite_functions


@tvm.transform.module_pass(opt_level=0, name="EinsumAsMatmul")
class EinsumAsMatmul:
    """Rewrite two-operand einsums that are matrix products; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        einsum = is_op("relax.einsum")(wildcard())

        def rewrite(expr: relax.Call, _matches) -> relax.Expr:
            operands = expr.args[0]
            if not isinstance(operands, relax.Tuple) or len(operands.fields) != 2:
                return expr
            a, b = operands.fields
            if a.ty.ndim < 0 or b.ty.ndim < 0 or a.ty.shape is None or b.ty.shape is None:
                return expr
            groups = _groups(str(expr.attrs.subscripts))
            return expr if groups is None else _as_matmul(a, b, *groups)

        return rewrite_functions(mod, einsum, rewrite)


def _groups(subscripts: str):
    """``(a, b, out, batch, left, contracted, right)`` letters of ``subscripts``, or None where
    the einsum is not a matrix product (see the module docstring)."""
    if "..." in subscripts or "->" not in subscripts:
        return None
    inputs, out = subscripts.replace(" ", "").split("->")
    if inputs.count(",") != 1:
        return None
    a, b = inputs.split(",")
    if any(len(set(s)) != len(s) for s in (a, b, out)) or not set(out) <= set(a) | set(b):
        return None
    if set(a) - set(b) - set(out) or set(b) - set(a) - set(out):
        return None  # summed over one operand only
    batch = [c for c in out if c in a and c in b]
    left = [c for c in out if c in a and c not in b]
    right = [c for c in out if c in b and c not in a]
    contracted = [c for c in a if c in b and c not in out]
    return a, b, out, batch, left, contracted, right


def _as_matmul(x, y, a, b, out, batch, left, contracted, right) -> relax.Expr:
    dims = {**dict(zip(b, y.ty.shape.values)), **dict(zip(a, x.ty.shape.values))}

    def product(letters):
        size = tvm.tirx.IntImm("int64", 1)
        for c in letters:
            size = size * dims[c]
        return size

    def arranged(operand, subs, rows, columns):  # [batch,] rows, columns
        moved = _permuted(operand, [subs.index(c) for c in batch + rows + columns])
        flat = ([product(batch)] if batch else []) + [product(rows), product(columns)]
        return relax.op.reshape(moved, flat)

    lhs = arranged(x, a, left, contracted)
    rhs = arranged(y, b, contracted, right)
    result = relax.op.reshape(relax.op.matmul(lhs, rhs), [dims[c] for c in batch + left + right])
    return _permuted(result, [(batch + left + right).index(c) for c in out])


def _permuted(expr: relax.Expr, order: list[int]) -> relax.Expr:
    return expr if order == sorted(order) else relax.op.permute_dims(expr, order)
