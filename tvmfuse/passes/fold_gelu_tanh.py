"""FoldGeluTanh: the tanh approximation of GELU written out in arithmetic becomes one
``nn.gelu_tanh``.

GPT-2's ``NewGELUActivation`` is ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 *
x ** 3)))``: eight elementwise ops that no epilogue pattern knew, with a libm ``powf`` and
``tanhf`` per element, a kernel of their own after every FFN up-projection (a fifth of GPT-2's
time). As ``gelu_tanh`` it is the matmul epilogue's activation, and the CPU
strategy computes it with a polynomial tanh.

Preconditions: imported Relax, before the fusion patterns.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ._rewrite import rewrite_functions, scalar_constant

#: The constants of the approximation, as PyTorch and transformers write them.
_CONSTANTS = (0.5, 3.0, 0.044715, math.sqrt(2.0 / math.pi), 1.0)


@tvm.transform.module_pass(opt_level=0, name="FoldGeluTanh")
class FoldGeluTanh:
    """Rewrite the written-out tanh GELU into ``nn.gelu_tanh``; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        x = wildcard()
        half, three, cubic, root, one = (is_const() for _ in range(5))
        inner = is_op("relax.add")(x, is_op("relax.multiply")(
            is_op("relax.power")(x, three), cubic))
        gate = is_op("relax.add")(is_op("relax.tanh")(is_op("relax.multiply")(inner, root)), one)
        pattern = is_op("relax.multiply")(is_op("relax.multiply")(x, half), gate)

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            found = [scalar_constant(matches[c]) for c in (half, three, cubic, root, one)]
            if any(f is None for f in found) or not all(
                    math.isclose(f, want, rel_tol=1e-6) for f, want in zip(found, _CONSTANTS)):
                return expr
            return relax.op.nn.gelu_tanh(matches[x])

        return rewrite_functions(mod, pattern, rewrite)
