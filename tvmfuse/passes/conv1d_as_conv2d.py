"""Conv1DAsConv2D: a 1-D conv is a 2-D conv over a height of 1, between two reshapes.

Whisper's audio stem is two ``Conv1d`` (80 -> 384 and 384 -> 384 channels, kernel 3, over 3000
frames). tvmfuse's conv schedules, layouts and epilogue patterns are 2-D; a conv1d fell to the
catch-all schedule and took two thirds of the encoder's time. As a conv2d it
gets the NHWC layout, packed weights and the register-blocked schedule; the reshapes add or drop
a unit axis and move no data.

Preconditions: imported Relax (NCW convs with OIW weights, static shapes), before the layout
passes and the fusion patterns.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ._rewrite import rewrite_functions, static_shape


@tvm.transform.module_pass(opt_level=0, name="Conv1DAsConv2D")
class Conv1DAsConv2D:
    """Rewrite NCW conv1d as NCHW conv2d with H = 1; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        x, weight = wildcard(), wildcard()
        pattern = is_op("relax.nn.conv1d")(x, weight)

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            attrs = expr.attrs
            data, kernel = static_shape(matches[x].ty.shape), static_shape(matches[weight].ty.shape)
            out = static_shape(expr.ty.shape)
            if (data is None or kernel is None or out is None or str(attrs.data_layout) != "NCW"
                    or str(attrs.kernel_layout) != "OIW" or str(attrs.out_layout) != "NCW"):
                return expr
            (stride,), (dilation,) = attrs.strides, attrs.dilation
            left, right = (int(p) for p in attrs.padding)
            conv = relax.op.nn.conv2d(
                relax.op.reshape(matches[x], [data[0], data[1], 1, data[2]]),
                relax.op.reshape(matches[weight], [kernel[0], kernel[1], 1, kernel[2]]),
                strides=(1, int(stride)), padding=(0, left, 0, right),
                dilation=(1, int(dilation)), groups=int(attrs.groups), out_dtype=attrs.out_dtype)
            return relax.op.reshape(conv, out)

        return rewrite_functions(mod, pattern, rewrite)
