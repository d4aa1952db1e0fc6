"""GlobalPoolToReduce: a pooling whose one window covers the whole input becomes a mean (or max)
over the spatial axes.

EfficientNet's head in transformers is ``AvgPool2d(1280, ceil_mode=True)`` on a 7x7 map: one
output whose window, 1280 x 1280, is clipped to the input, so PyTorch averages the 49 values.
TVM's lowering walks the whole window with a bounds test per step: 1280 x 1280 x 1280 channels
tests, nearly all of the model's time, for what ``mean`` does in microseconds.

Preconditions: imported Relax (NCHW or NHWC pools with static shapes), before the fusion
patterns.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ._rewrite import rewrite_functions, static_shape

_REDUCE = {"relax.nn.avg_pool2d": relax.op.mean, "relax.nn.max_pool2d": relax.op.max}


@tvm.transform.module_pass(opt_level=0, name="GlobalPoolToReduce")
class GlobalPoolToReduce:
    """Rewrite single-window unpadded 2-D pools into spatial reductions; see the module
    docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        x = wildcard()
        pattern = is_op("relax.nn.avg_pool2d")(x) | is_op("relax.nn.max_pool2d")(x)

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            axes = _spatial_axes(expr)
            shape, out = static_shape(matches[x].ty.shape), static_shape(expr.ty.shape)
            if axes is None or shape is None or out is None or any(out[a] != 1 for a in axes):
                return expr
            attrs = expr.attrs
            if any(int(p) for p in attrs.padding) or any(int(d) != 1 for d in attrs.dilation):
                return expr
            if any(int(k) < shape[a] for k, a in zip(attrs.pool_size, axes)):
                return expr  # the window leaves part of the input out
            return _REDUCE[expr.op.name](matches[x], axis=axes, keepdims=True)

        return rewrite_functions(mod, pattern, rewrite)


def _spatial_axes(pool: relax.Call) -> list[int] | None:
    layout = str(pool.attrs.layout)
    if layout != str(pool.attrs.out_layout) or sorted(layout) != sorted("NCHW"):
        return None
    return [layout.index("H"), layout.index("W")]
