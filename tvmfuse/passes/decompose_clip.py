"""DecomposeClip: ``clip(x, lo, hi)`` with constant bounds becomes ``minimum(maximum(x, lo), hi)``
(an integer clip without its infinite bounds).

ConvertLayout has no layout rule for ``relax.clip``, so converting MobileNetV2's convs to NHWC put
a transpose before and after every ReLU6 (34 pairs: 96 kernels instead of 60, and no conv
epilogue could reach its activation). ``maximum`` and ``minimum`` with scalar constants are
broadcasting binary ops, which ConvertLayout carries through; the epilogue patterns accept both
forms of a clip.

Preconditions: imported Relax, before ConvertLayout and the fusion patterns.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ._rewrite import rewrite_functions


@tvm.transform.module_pass(opt_level=0, name="DecomposeClip")
class DecomposeClip:
    """Rewrite constant-bound clips into maximum/minimum; see the module docstring.

    ``integer_only`` rewrites only the clips of integer tensors: the importer's fix-up (torch's
    ``clamp(ids, min=1)`` arrives as ``clip(ids, 1, inf)``, which the first constant fold cannot
    legalize), leaving float clips to the layout phase.
    """

    def __init__(self, integer_only: bool = False):
        self.integer_only = integer_only

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        x = wildcard()
        pattern = is_op("relax.clip")(x, wildcard(), wildcard())

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            low, high = (_bound(arg) for arg in expr.args[1:])
            dtype = str(matches[x].ty.dtype)
            if low is None or high is None:
                return expr
            if dtype.startswith(("int", "uint")):
                clipped = _integer_clip(matches[x], low, high, dtype)
                return expr if clipped is None else clipped
            if self.integer_only or not dtype.startswith("float"):
                return expr
            lowered = relax.op.maximum(matches[x], relax.const(low, dtype))
            return relax.op.minimum(lowered, relax.const(high, dtype))

        return rewrite_functions(mod, pattern, rewrite)


def _integer_clip(x: relax.Expr, low: float, high: float, dtype: str) -> relax.Expr | None:
    """An integer clip without its infinite bounds (``torch.clamp(ids, min=1)`` imports with
    ``inf`` as its upper bound, which TVM's legalization cannot cast to an integer); None when a
    finite bound is not a whole number."""
    if any(not math.isinf(b) and b != int(b) for b in (low, high)):
        return None
    if not math.isinf(low):
        x = relax.op.maximum(x, relax.const(int(low), dtype))
    if not math.isinf(high):
        x = relax.op.minimum(x, relax.const(int(high), dtype))
    return x


def _bound(arg: relax.Expr) -> float | None:
    """A clip bound's value when it is an immediate (0.27 passes ``FloatImm``/``IntImm``)."""
    value = getattr(arg, "value", None) if isinstance(arg, tvm.ir.expr.Constant) else None
    return float(value) if isinstance(value, (int, float)) else None
