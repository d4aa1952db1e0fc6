"""StackAsConcat: ``stack(xs, axis=k)`` becomes ``concat([expand_dims(x, k) ...], axis=k)``, and a
``min``/``max``/``sum`` over the stacked axis becomes ``minimum``/``maximum``/``add`` of the
stacked tensors.

TVM's layout rule for ``relax.stack`` names the new axis ``S`` in its output layout, a letter no
consumer's rule can find ("Invalid SLayout: can't find S in source layout ABCD"), so ConvertLayout
failed on any model with a stack, a conv or not. The ONNX importer writes the variadic
``Min``/``Max``/``Sum`` as a stack reduced over its new axis (Apertus's xIELU activation): those
become elementwise ops, with no stacked copy of their inputs.

Preconditions: imported Relax, before ConvertLayout.
"""

from __future__ import annotations

import functools

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ._rewrite import rewrite_functions

#: A reduction over the stacked axis -> the elementwise op that folds the stacked tensors.
FOLDS = {"relax.min": relax.op.minimum, "relax.max": relax.op.maximum, "relax.sum": relax.op.add}


@tvm.transform.module_pass(opt_level=0, name="StackAsConcat")
class StackAsConcat:
    """Rewrite stacks and the reductions over them; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        stack = is_op("relax.stack")(wildcard())
        reduced = is_op("relax.min")(stack) | is_op("relax.max")(stack) | is_op("relax.sum")(stack)

        def fold(expr: relax.Expr, matches) -> relax.Expr:
            stacked = matches[stack]
            if stacked.ty.ndim < 0:  # an unknown rank: no axis to count from the front
                return expr
            axis = _axis(stacked)
            if [int(a) for a in expr.attrs.axis or []] not in ([axis], [axis - stacked.ty.ndim]):
                return expr
            out = functools.reduce(FOLDS[expr.op.name], _fields(stacked.args[0]))
            return relax.op.expand_dims(out, axis) if expr.attrs.keepdims else out

        def as_concat(expr: relax.Expr, _matches) -> relax.Expr:
            if expr.ty.ndim < 0:
                return expr
            axis = _axis(expr)
            fields = [relax.op.expand_dims(x, axis) for x in _fields(expr.args[0])]
            return relax.op.concat(fields, axis=axis)

        return rewrite_functions(rewrite_functions(mod, reduced, fold), stack, as_concat)


def _fields(tup: relax.Expr) -> list[relax.Expr]:
    if isinstance(tup, relax.Tuple):
        return list(tup.fields)
    return [relax.TupleGetItem(tup, i) for i in range(len(tup.ty.fields))]


def _axis(stacked: relax.Call) -> int:
    """The stacked axis, counted from the front of the stack's output."""
    axis = stacked.attrs.axis
    return (0 if axis is None else int(axis)) % stacked.ty.ndim
