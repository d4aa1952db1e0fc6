"""CheckLegalized: after LegalizeOps every graph-level operator must have become a kernel.

An operator TVM has no lowering for stays a Relax call, and VM codegen later fails with
"CodeGenVM cannot emit this Relax operator directly", naming nothing. This pass names the
operators left, how many times each, so the user knows what to replace or report.

Preconditions: after LegalizeOps (and the library dispatch before it).
"""

from __future__ import annotations

from collections import Counter

import tvm
from tvm import relax

from ..errors import CompileError

#: Operators the VM runs itself (calls of kernels and packed functions, shape bookkeeping).
_RUNTIME_PREFIXES = ("relax.call_", "relax.builtin.", "relax.memory.", "relax.vm.", "relax.hint.",
                     "relax.invoke_", "relax.null_value", "relax.shape_of", "relax.print",
                     "relax.assert_op", "relax.tensor_to_shape", "relax.shape_to_tensor",
                     "relax.to_vdevice")


@tvm.transform.module_pass(opt_level=0, name="CheckLegalized")
class CheckLegalized:
    """Raise a CompileError naming every operator LegalizeOps left; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        left = Counter()

        def visit(expr):
            if (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
                    and not expr.op.name.startswith(_RUNTIME_PREFIXES)):
                left[expr.op.name.removeprefix("relax.")] += 1

        for func in mod.functions.values():
            if isinstance(func, relax.Function):
                relax.analysis.post_order_visit(func, visit)
        if left:
            ops = ", ".join(f"{name} (x{count})" for name, count in sorted(left.items()))
            raise CompileError(
                f"TVM has no lowering for {ops}: these operators reached code generation as "
                f"they were imported; replace them in the model (a decomposition before "
                f"export) or report the model"
            )
        return mod
