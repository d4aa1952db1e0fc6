"""FoldPadIntoConv: a zero ``pad`` of the spatial axes right before a conv becomes the conv's own
(possibly asymmetric) padding.

TensorFlow-style "same" padding reaches Relax as ``nn.pad`` then an unpadded conv
(EfficientNet's strided depthwise convs: ``ZeroPad2d((0, 1, 0, 1))``). ConvertLayout has no
layout rule for ``pad``, so the NHWC conversion put the pad back in NCHW, between two
transposes, a third of EfficientNet-B0's time spent transposing and padding. As the
conv's padding it is the padding the conv schedules already handle.

Preconditions: imported Relax (NCHW or NHWC convs), before ConvertLayout.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ._rewrite import rewrite_functions


@tvm.transform.module_pass(opt_level=0, name="FoldPadIntoConv")
class FoldPadIntoConv:
    """Fold constant-zero spatial pads into the conv2d they feed; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        x, weight = wildcard(), wildcard()
        pad = is_op("relax.nn.pad")(x)
        pattern = is_op("relax.nn.conv2d")(pad, weight)

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            padding = _spatial_padding(matches[pad], str(expr.attrs.data_layout))
            if padding is None:
                return expr
            (top, bottom), (left, right) = padding
            old = [int(p) for p in expr.attrs.padding]
            attrs = expr.attrs
            return relax.op.nn.conv2d(
                matches[x], matches[weight], strides=attrs.strides,
                padding=[old[0] + top, old[1] + left, old[2] + bottom, old[3] + right],
                dilation=attrs.dilation, groups=attrs.groups, data_layout=attrs.data_layout,
                kernel_layout=attrs.kernel_layout, out_layout=attrs.out_layout,
                out_dtype=attrs.out_dtype)

        return rewrite_functions(mod, pattern, rewrite)


def _spatial_padding(pad: relax.Call, layout: str):
    """((top, bottom), (left, right)) of a constant-zero pad of only the H and W axes of
    ``layout``, else None."""
    attrs = pad.attrs
    if str(attrs.pad_mode) != "constant" or float(attrs.pad_value) != 0.0:
        return None
    widths = [int(w) for w in attrs.pad_width]
    pairs = list(zip(widths[0::2], widths[1::2]))
    if len(pairs) != len(layout) or any(min(p) < 0 for p in pairs):
        return None
    if any(pair != (0, 0) for axis, pair in zip(layout, pairs) if axis not in "HW"):
        return None
    return pairs[layout.index("H")], pairs[layout.index("W")]
