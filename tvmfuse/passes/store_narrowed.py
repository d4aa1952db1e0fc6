"""StoreNarrowed: a float32 tensor that the graph also narrows to float16 is stored once, narrowed;
its other readers widen the narrowed copy.

``ToMixedPrecision`` keeps LayerNorm in float32 and narrows its output for the next GEMM, so a
transformer holds each layer's normalized rows twice: the float32 rows (the next residual add
reads them) and their float16 copy (the GEMM reads it). In BERT-base that is two kernels per
LayerNorm that only convert (a 4096 x 768 widening of the GEMM's output before it, a narrowing
after it: 48 launches and 0.4 ms of 6.5 at batch 32 on the H200), because the norm's float32
output escapes the group a fusion pattern could give the narrowing to. After this pass the
norm's only reader is its narrowing, the residual reads ``astype(narrowed, float32)``, and
``add_layer_norm``'s pattern takes both casts into the LayerNorm's kernel, which then reads and
writes float16 and computes in float32: the float16 storage a float16 build asks for (PyTorch's
float16 models keep their residual stream in float16 too).

Values that leave the function (a model output) keep their float32 readers.

Preconditions: run after ``ToMixedPrecision`` and before fusion.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._rewrite import NARROW_FLOATS, calls_op


@tvm.transform.module_pass(opt_level=0, name="StoreNarrowed")
class StoreNarrowed:
    """Read float32 values that are also narrowed from their narrow copy; see the module
    docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        narrowing = {}
        for func in mod.functions.values():
            if isinstance(func, relax.Function):
                narrowing.update(_narrowings(func))
        if not narrowing:
            return mod
        rewriter = _Rewriter(mod, narrowing)
        for gvar, func in mod.functions.items():
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
        return rewriter.builder_.get()


def _narrowings(func: relax.Function) -> dict[relax.Var, relax.VarBinding]:
    """float32 dataflow values -> the binding that narrows them, where they have other readers
    (one narrowing each: the first)."""
    readers: dict[relax.Var, int] = {}
    first: dict[relax.Var, relax.VarBinding] = {}
    leaving: set[relax.Var] = set()  # read by a block's output binding

    def count(expr):
        if isinstance(expr, relax.Var):
            readers[expr] = readers.get(expr, 0) + 1

    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        for binding in block.bindings:
            relax.analysis.post_order_visit(binding.value, count)
            if not isinstance(binding.var, relax.DataflowVar):
                relax.analysis.post_order_visit(
                    binding.value, lambda e: leaving.add(e) if isinstance(e, relax.Var) else None)
            value = binding.value
            if (calls_op(value, "relax.astype") and str(value.attrs.dtype) in NARROW_FLOATS
                    and isinstance(value.args[0], relax.DataflowVar)
                    and str(value.args[0].ty.dtype) == "float32"):
                first.setdefault(value.args[0], binding)
    return {var: binding for var, binding in first.items()
            if readers.get(var, 0) > 1 and var not in leaving}


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    """Emits each narrowing right after the value it narrows, then remaps the value's later
    readers to ``astype(narrowed, float32)``."""

    def __init__(self, mod, narrowing: dict[relax.Var, relax.VarBinding]):
        super().__init__(mod)
        self.narrowing = narrowing
        self.moved = {binding.var: None for binding in narrowing.values()}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var in self.moved:  # emitted already, after the value it narrows
            self.set_var_remap(binding.var, self.moved[binding.var])
            return
        super().visit_var_binding_(binding)
        narrowing = self.narrowing.get(binding.var)
        if narrowing is None:
            return
        value = self.visit_expr(binding.var)  # the value as emitted
        narrow = self.builder_.emit(relax.op.astype(value, narrowing.value.attrs.dtype))
        self.moved[narrowing.var] = narrow
        self.set_var_remap(binding.var, self.builder_.emit(relax.op.astype(narrow, "float32")))
