"""PadConvChannels: a conv whose output channels no vector of 4 or more divides computes whole
vectors of them over a zero-padded weight, and a slice keeps the real ones.

The CPU conv schedule vectorizes the output channels and cannot pad them itself (``pad_einsum``
takes einsums, and a conv reads ``h + kh``): a 3x3 conv to 77 channels found no register tile
and fell to the catch-all schedule at 3.3 GFLOP/s on a 2-core Zen 3
(`benchmarks/shape_sweep.py --families conv`), where 64 or 96 channels ran at 167-174. Padded to
80, it takes the register-blocked schedule; the slice (and the bias and activation after it) is
one elementwise kernel over the output. Channels that a narrower vector divides (24 on AVX-512:
8 lanes) keep their tiles.

Preconditions: after the layout passes (NHWC data, HWIO weights), dense convs (groups 1).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ..schedules.cpu._tir import lanes_for
from ._rewrite import rewrite_functions, static_shape


@tvm.transform.module_pass(opt_level=0, name="PadConvChannels")
class PadConvChannels:
    """Pad the output channels of NHWC/HWIO convs that no vector of 4 divides to a multiple of
    ``lanes``; see the module docstring."""

    def __init__(self, lanes: int):
        self.lanes = lanes

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        x, weight = wildcard(), wildcard()
        pattern = is_op("relax.nn.conv2d")(x, weight)
        lanes = self.lanes

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            attrs = expr.attrs
            kernel, out = static_shape(matches[weight].ty.shape), static_shape(expr.ty.shape)
            if (kernel is None or out is None or str(attrs.data_layout) != "NHWC"
                    or str(attrs.kernel_layout) != "HWIO" or str(attrs.out_layout) != "NHWC"
                    or int(attrs.groups) != 1 or lanes_for(kernel[3], lanes) >= 4
                    or kernel[3] < lanes):
                return expr
            channels = kernel[3]
            padded = -(-channels // lanes) * lanes
            wide = relax.op.nn.pad(matches[weight], [0, 0, 0, 0, 0, 0, 0, padded - channels])
            conv = relax.op.nn.conv2d(
                matches[x], wide, strides=attrs.strides, padding=attrs.padding,
                dilation=attrs.dilation, data_layout="NHWC", kernel_layout="HWIO",
                out_dtype=attrs.out_dtype)
            return relax.op.strided_slice(conv, axes=[3], begin=[0], end=[channels])

        return rewrite_functions(mod, pattern, rewrite)
