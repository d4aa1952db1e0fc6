"""NormalizeSqueezeAxes: ``squeeze`` with negative axes gets the same axes counted from the front.

TVM's layout inference for squeeze does not handle negative axes: ConvertLayout dies with
``std::bad_alloc`` on Swin's ``x.mean((-1, -2), keepdim=True).squeeze(-2)``-style pooling
(``AdaptiveAvgPool1d`` then ``flatten``), even though no conv feeds it.

Preconditions: imported Relax with static ranks, before ConvertLayout.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ._rewrite import rewrite_functions


@tvm.transform.module_pass(opt_level=0, name="NormalizeSqueezeAxes")
class NormalizeSqueezeAxes:
    """Rewrite negative squeeze axes as non-negative ones; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        x = wildcard()
        pattern = is_op("relax.squeeze")(x)

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            axes, rank = expr.attrs.axis, matches[x].ty.ndim
            if axes is None or rank < 0 or all(int(a) >= 0 for a in axes):
                return expr
            return relax.op.squeeze(matches[x], [int(a) % rank for a in axes])

        return rewrite_functions(mod, pattern, rewrite)
