"""SimplifyBoundedShapes: shapes simplified with the bounds of their symbolic dimensions, so that
a ``seq``-long tensor stays ``seq`` long, not ``min(seq, 512)``.

transformers takes position ids as ``position_ids[:, :seq]`` of a buffer of
``max_position_embeddings``; with ``seq`` symbolic, torch.export types that ``Min(seq, 512)``
and TVM's importer keeps it, in the slice and in the reshapes after it, so everything that adds
the positions to a ``seq``-long tensor loses its shape (``R.Tensor(ndim=3)``) and no kernel after
it can be scheduled for ``seq``. The function's ``tir_var_upper_bound`` and
``tir_var_lower_bound`` (the range ``torch.export`` was given: ``--max-seq``) settle it: shape
expressions are simplified under the bounds, a slice the bounds prove in bounds is marked
``assume_inbound`` (and its axes made non-negative: TVM's slice of a symbolic extent rejects
axis -1, GPT-2's causal mask), and every binding after them is typed again.

Preconditions: bounded symbolic dimensions (``tir_var_upper_bound``); before LegalizeOps.
"""

from __future__ import annotations

import tvm
from tvm import relax, sym

from ._rewrite import calls_op


@tvm.transform.module_pass(opt_level=0, name="SimplifyBoundedShapes")
class SimplifyBoundedShapes:
    """Simplify shapes under the symbolic bounds; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewriter = None
        for gvar, func in mod.functions.items():
            upper = (func.attrs.get("tir_var_upper_bound")
                     if isinstance(func, relax.Function) and func.attrs is not None else None)
            if not upper:
                continue
            bounds = {str(name): int(value) for name, value in upper.items()}
            lower = {str(name): int(value)
                     for name, value in (func.attrs.get("tir_var_lower_bound") or {}).items()}
            rewriter = rewriter or _Simplify(mod)
            rewriter.analyzer = sym.Analyzer()
            for var in relax.analysis.defined_symbolic_vars(func):
                if var.name in bounds:
                    rewriter.analyzer.bind(var, tvm.ir.Range(lower.get(var.name, 0),
                                                             bounds[var.name] + 1))
            rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
        return rewriter.builder_.get() if rewriter else mod


@relax.expr_functor.mutator
class _Simplify(relax.PyExprMutator):
    """A mutator: types change, and with them every type after them (it re-emits them)."""

    analyzer: sym.Analyzer  # knows the bounded variables' ranges

    def visit_shape_expr_(self, shape: relax.ShapeExpr) -> relax.Expr:
        values = [self.analyzer.simplify(v) for v in shape.values]
        if all(a.same_as(b) for a, b in zip(values, shape.values)):
            return shape
        return relax.ShapeExpr(values)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not calls_op(call, "relax.strided_slice") or call.attrs.assume_inbound:
            return call
        data, axes, begin, end = call.args[:4]
        strides = call.args[4] if len(call.args) > 4 else None
        shape = getattr(data.ty, "shape", None)
        if shape is None or not all(isinstance(t, relax.Tuple) for t in (axes, begin, end)):
            return call
        rank = len(shape.values)
        positive = [int(axis) % rank for axis in axes.fields]  # TVM's symbolic slice takes no -1
        inbound = all(self.analyzer.can_prove(low >= 0)
                      and self.analyzer.can_prove(high <= shape.values[axis])
                      for axis, low, high in zip(positive, begin.fields, end.fields))
        if not inbound and positive == [int(axis) for axis in axes.fields]:
            return call
        return relax.op.strided_slice(data, positive, begin, end, strides,
                                      assume_inbound=inbound)
