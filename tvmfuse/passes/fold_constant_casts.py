"""FoldConstantCasts: ``astype(constant)`` becomes the constant in the new dtype.

``ToMixedPrecision`` casts every float32 constant it feeds to a float16 op with an ``astype``
binding, and Relax's ``FoldConstant`` leaves those casts of scalars standing: ReLU6's bounds then
stop being constants, and no epilogue pattern can take the activation into its conv (MobileNetV2
at float16 had a standalone ``maximum``/``minimum`` kernel after every conv).

Preconditions: any Relax; run after ``ToMixedPrecision``.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op

from ._rewrite import rewrite_functions


@tvm.transform.module_pass(opt_level=0, name="FoldConstantCasts")
class FoldConstantCasts:
    """Evaluate casts of constants at build time; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        constant = is_const()
        pattern = is_op("relax.astype")(constant)

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            dtype = str(expr.attrs.dtype)
            return relax.const(matches[constant].value.numpy().astype(dtype), dtype)

        return rewrite_functions(mod, pattern, rewrite)
