"""CompareBooleansAsIntegers: a comparison (``<``, ``<=``, ``>``, ``>=``, ``==``, ``!=``) of
boolean tensors compares them as int8 (False 0, True 1, as PyTorch orders them).

TVM's LLVM code generator takes its boolean type for neither an integer nor a float: an ordering
failed ("Check failed: t.MatchesCode(kDLFloat)" in CreateLT: LongT5's global-attention mask
``mask > 0`` over a bool tensor), and an equality became a float compare of ``i1`` values, which
LLVM's verifier refuses (LongCat-Flash's ONNX floor division, ``Equal(Less(x, 0), True)``).

Preconditions: any Relax.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ._rewrite import rewrite_functions

#: The comparisons by op name.
_COMPARISONS = {"relax.less": relax.op.less, "relax.less_equal": relax.op.less_equal,
                "relax.greater": relax.op.greater, "relax.greater_equal": relax.op.greater_equal,
                "relax.equal": relax.op.equal, "relax.not_equal": relax.op.not_equal}


@tvm.transform.module_pass(opt_level=0, name="CompareBooleansAsIntegers")
class CompareBooleansAsIntegers:
    """Compare boolean operands as int8; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        pattern = None
        for name in _COMPARISONS:
            op = is_op(name)(wildcard(), wildcard())
            pattern = op if pattern is None else pattern | op

        def rewrite(expr: relax.Call, _matches) -> relax.Expr:
            if not any(str(getattr(a.ty, "dtype", "")) == "bool" for a in expr.args):
                return expr
            widened = [relax.op.astype(a, "int8") if str(a.ty.dtype) == "bool" else a
                       for a in expr.args]
            return _COMPARISONS[expr.op.name](*widened)

        return rewrite_functions(mod, pattern, rewrite)
