"""CompareBooleansAsIntegers: an ordering comparison (``<``, ``<=``, ``>``, ``>=``) of boolean
tensors compares them as int8 (False 0, True 1, as PyTorch orders them).

TVM's LLVM code generator has no ordering of its boolean type ("Check failed:
t.MatchesCode(kDLFloat)" in CreateLT): LongT5's global-attention mask ``mask > 0`` over a bool
tensor did not compile.

Preconditions: any Relax.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ._rewrite import rewrite_functions

#: The ordering comparisons by op name.
_ORDERINGS = {"relax.less": relax.op.less, "relax.less_equal": relax.op.less_equal,
              "relax.greater": relax.op.greater, "relax.greater_equal": relax.op.greater_equal}


@tvm.transform.module_pass(opt_level=0, name="CompareBooleansAsIntegers")
class CompareBooleansAsIntegers:
    """Compare boolean operands of orderings as int8; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        pattern = None
        for name in _ORDERINGS:
            op = is_op(name)(wildcard(), wildcard())
            pattern = op if pattern is None else pattern | op

        def rewrite(expr: relax.Call, _matches) -> relax.Expr:
            if not any(str(getattr(a.ty, "dtype", "")) == "bool" for a in expr.args):
                return expr
            widened = [relax.op.astype(a, "int8") if str(a.ty.dtype) == "bool" else a
                       for a in expr.args]
            return _ORDERINGS[expr.op.name](*widened)

        return rewrite_functions(mod, pattern, rewrite)
