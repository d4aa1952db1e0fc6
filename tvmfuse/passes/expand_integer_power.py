"""ExpandIntegerPower: ``x ** n`` for a constant whole ``n`` from 1 to 4 becomes products of
``x``.

RMSNorm (Llama, T5) squares its input with ``pow(x, 2)``, which TVM legalizes into ``powf``.
TVM compiles CUDA with ``--use_fast_math``, where ``powf`` is ``exp2(n * log2(x))``: NaN for
every negative ``x``, so each fp16 and bf16 Llama and T5 built for the GPU returned NaN (the
CPU's libm was right). ``x * x`` is
exact on every target and cheaper than ``powf`` (still its own kernel before the norm's
reduction: TVM's FuseOps does not fuse an elementwise producer into a reduction).

Preconditions: imported Relax, after FoldGeluTanh (whose pattern matches GELU's ``x ** 3``).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ._rewrite import rewrite_functions, scalar_constant

#: The exponents written out as products.
EXPONENTS = (1, 2, 3, 4)


@tvm.transform.module_pass(opt_level=0, name="ExpandIntegerPower")
class ExpandIntegerPower:
    """Rewrite ``power(x, n)`` for a constant ``n`` in :data:`EXPONENTS` into multiplications;
    see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        x, exponent = wildcard(), is_const()
        pattern = is_op("relax.power")(x, exponent)

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            n = scalar_constant(matches[exponent])
            base = matches[x]
            if n not in EXPONENTS or expr.ty.shape.values is None \
                    or list(expr.ty.shape.values) != list(base.ty.shape.values) \
                    or expr.ty.dtype != base.ty.dtype:
                return expr  # a broadcast or a cast in the power: left as it is
            if n == 1:
                return base
            square = relax.op.multiply(base, base)
            if n == 2:
                return square
            return relax.op.multiply(square, base if n == 3 else square)

        return rewrite_functions(mod, pattern, rewrite)
