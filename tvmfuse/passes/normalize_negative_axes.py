"""NormalizeNegativeAxes: ``squeeze`` and ``permute_dims`` with negative axes get the same axes
counted from the front.

TVM's layout inference handles neither op's negative axes: ConvertLayout dies with
``std::bad_alloc`` on Swin's ``x.mean((-1, -2), keepdim=True).squeeze(-2)``-style pooling
(``AdaptiveAvgPool1d`` then ``flatten``), and fails with "Invalid layout A?@B" on Falcon-H1's
``permute(0, -2, -1, 1)`` (the letters before ``A``), even though no conv feeds either.

Preconditions: imported Relax with static ranks, before ConvertLayout.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ._rewrite import rewrite_functions


@tvm.transform.module_pass(opt_level=0, name="NormalizeNegativeAxes")
class NormalizeNegativeAxes:
    """Rewrite negative squeeze and permute axes as non-negative ones; see the module
    docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        x = wildcard()
        pattern = is_op("relax.squeeze")(x) | is_op("relax.permute_dims")(x)

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            rank = matches[x].ty.ndim
            squeeze = expr.op.name == "relax.squeeze"
            axes = expr.attrs.axis if squeeze else expr.attrs.axes
            if axes is None or rank < 0 or all(int(a) >= 0 for a in axes):
                return expr
            axes = [int(a) % rank for a in axes]
            return (relax.op.squeeze if squeeze else relax.op.permute_dims)(matches[x], axes)

        return rewrite_functions(mod, pattern, rewrite)
