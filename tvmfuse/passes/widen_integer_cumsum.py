"""WidenIntegerCumsum: a cumsum of booleans or narrow integers sums in int64, as PyTorch does.

``torch.cumsum`` of a bool or int32 tensor returns int64; TVM's importer passes ``dtype=None``,
which Relax reads as "the input's dtype", so a bool cumsum saturates at True. transformers builds
its masks that way (``(position_diff != 1).cumsum(-1)`` numbers packed sequences, RoBERTa counts
non-padding tokens): imported as is, GPT-2's mask compares saturated booleans.

Preconditions: a module imported from PyTorch (ONNX's CumSum keeps its input's dtype).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._rewrite import calls_op

#: The dtypes PyTorch's cumsum promotes to int64.
_NARROW = ("bool", "int8", "int16", "int32", "uint8")


@tvm.transform.module_pass(opt_level=0, name="WidenIntegerCumsum")
class WidenIntegerCumsum:
    """Give cumsums of bool and narrow integer inputs an int64 result; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewriter = _Widen(mod)
        for gvar, func in mod.functions.items():
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
        return rewriter.builder_.get()


@relax.expr_functor.mutator
class _Widen(relax.PyExprMutator):
    """A mutator rather than a dpl rewrite: the result's dtype changes, so every binding after it
    must be typed again (the mutator re-emits them; ``rewrite_call`` keeps the old types)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not calls_op(call, "relax.cumsum") or call.attrs.dtype not in (None, ""):
            return call
        data = call.args[0]
        if str(data.ty.dtype) not in _NARROW:
            return call
        return relax.op.cumsum(relax.op.astype(data, "int64"), call.attrs.axis, dtype="int64",
                               exclusive=call.attrs.exclusive)
