"""PadConvChannels: a conv whose output channels no vector of 4 or more divides computes whole
vectors of them over a zero-padded weight, and a slice keeps the real ones; a depthwise conv over
channels that whole vectors do not divide pads its input's channels too.

The CPU conv schedule vectorizes the output channels and cannot pad them itself (``pad_einsum``
takes einsums, and a conv reads ``h + kh``): a 3x3 conv to 77 channels found no register tile
and fell to the catch-all schedule, fifty times slower than 64 or 96 channels
(``benchmarks/shape_sweep.py --families conv``). Padded to
80, it takes the register-blocked schedule; the slice (and the bias and activation after it) is
one elementwise kernel over the output. Channels that a narrower vector divides (24 on AVX-512:
8 lanes) keep their tiles in a dense conv (padding them adds to its reduction's work too).

A depthwise conv's vector axis is its input's channels as well as its output's, and its input is
an activation, which the schedule does not pad either: 197 channels fell to the catch-all
schedule, several times slower than 32-672 channels. Padded, its input is
copied once into a zero-padded buffer of whole vectors, the spatial padding included where the
strides are 1 (the copy the conv schedule makes of a padded input anyway; a strided depthwise conv
reads through its spatial padding instead, see ``schedules/cpu/_blocked.py``), and the slice, bias
and activation join the conv's kernel. That holds for any depthwise conv whose channels whole
vectors do not divide: over 72 channels on AVX-512 a 28x28 3x3 conv in 8-lane vectors runs
at half the speed it reaches padded to 80 in 16-lane ones (as fast as 96 channels), with the
tile's last, partial vector of each row stored apart (``tvmfuse.passes.part_tail``).

With ``pair_inputs`` (a core with the bf16 pair dot product, see ``schedules/cpu/bf16_dot.py``)
a bf16 conv over an odd number of input channels (an RGB stem's 3) reads one more, zero, channel
and a zero weight for it: the pair instruction takes the reduction over input channels two at a
time, and without the even count the stem ran in float32 arithmetic at half the rate of the
other convs (ResNet-50's 7x7 stem: 1.2 of 21 ms in bf16 on a Zen 4,
``tvmfuse inspect resnet50 --dtype bf16 --profile``).

Preconditions: after the layout passes (NHWC data, HWIO weights), dense convs (groups 1) and
depthwise ones (groups = input channels = output channels).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ..schedules.tir_util import lanes_for
from ._rewrite import rewrite_functions, static_shape


@tvm.transform.module_pass(opt_level=0, name="PadConvChannels")
class PadConvChannels:
    """Pad the output channels of NHWC/HWIO convs that no vector of 4 divides (of depthwise
    convs: that ``lanes`` does not divide) to a multiple of ``lanes``; see the module
    docstring."""

    def __init__(self, lanes: int, pair_inputs: bool = False):
        self.lanes, self.pair_inputs = lanes, pair_inputs

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        x, weight = wildcard(), wildcard()
        pattern = is_op("relax.nn.conv2d")(x, weight)
        lanes, pair_inputs = self.lanes, self.pair_inputs

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            attrs = expr.attrs
            kernel, out = static_shape(matches[weight].ty.shape), static_shape(expr.ty.shape)
            if (kernel is None or out is None or str(attrs.data_layout) != "NHWC"
                    or str(attrs.kernel_layout) != "HWIO" or str(attrs.out_layout) != "NHWC"
                    or not (int(attrs.groups) == 1 or _is_depthwise(attrs, kernel))):
                return expr
            data, wide = matches[x], matches[weight]
            paired = (pair_inputs and int(attrs.groups) == 1 and kernel[2] % 2
                      and str(data.ty.dtype) == "bfloat16")
            if paired:
                data = relax.op.nn.pad(data, [0, 0, 0, 0, 0, 0, 0, 1])
                wide = relax.op.nn.pad(wide, [0, 0, 0, 0, 0, 1, 0, 0])
            channels, padding, groups = kernel[3], attrs.padding, int(attrs.groups)
            narrow = _narrow(channels, lanes, depthwise=_is_depthwise(attrs, kernel))
            if not (narrow or paired):
                return expr
            if narrow:
                padded = -(-channels // lanes) * lanes
                wide = relax.op.nn.pad(wide, [0, 0, 0, 0, 0, 0, 0, padded - channels])
                if groups != 1:  # depthwise: its input's channels too (see above)
                    data, padding = _pad_input(data, padding, attrs.strides, padded - channels)
                    groups = padded
            conv = relax.op.nn.conv2d(
                data, wide, strides=attrs.strides, padding=padding, dilation=attrs.dilation,
                groups=groups, data_layout="NHWC", kernel_layout="HWIO",
                out_dtype=attrs.out_dtype)
            if not narrow:
                return conv
            return relax.op.strided_slice(conv, axes=[3], begin=[0], end=[channels])

        return rewrite_functions(mod, pattern, rewrite)


def _narrow(channels: int, lanes: int, *, depthwise: bool) -> bool:
    """Whether a conv to ``channels`` would take vectors narrower than ``lanes``: any that whole
    vectors do not divide for a depthwise conv, those no vector of 4 divides for a dense one."""
    if channels < lanes or channels % lanes == 0:
        return False
    return depthwise or lanes_for(channels, lanes) < 4


def _is_depthwise(attrs, kernel: list[int]) -> bool:
    """One input channel a group, one output channel a group (HWIO ``[kh, kw, 1, groups]``)."""
    return kernel[2] == 1 and kernel[3] == int(attrs.groups)


def _pad_input(data: relax.Expr, padding, strides, extra: int) -> tuple[relax.Expr, list[int]]:
    """``data`` (NHWC) with ``extra`` zero channels, and the conv's padding left to apply: with
    strides of 1 the spatial padding is done in the same copy (``[top, left, bottom, right]``
    -> 0), otherwise kept for the conv to read through."""
    top, left, bottom, right = (int(p) for p in padding)
    if any(int(s) != 1 for s in strides):
        return relax.op.nn.pad(data, [0, 0, 0, 0, 0, 0, 0, extra]), [top, left, bottom, right]
    return relax.op.nn.pad(data, [0, 0, top, bottom, left, right, 0, extra]), [0, 0, 0, 0]
