"""MergeSummedConv: two 1x1 convs whose outputs are added become one conv over their concatenated
inputs (the reduction axis concatenated, "K-concatenation").

A ResNet bottleneck block with a downsample path ends in ``conv1x1(h, W3) + b3 + conv1x1(x, Wd,
stride s) + bd``. The downsample conv cannot be merged with a conv that reads the same ``x``
(torchvision puts the block's stride in its 3x3 conv, so no other conv of ``x`` has stride ``s``),
but a sum of two 1x1 convs with the same output is one 1x1 conv over the channel concatenation of
their inputs: ``conv1x1(concat(h, x[::s, ::s]), [W3; Wd]) + (b3 + bd)``. One kernel instead of
two, and the downsample's output never goes through memory; the concatenated input (``h`` and the
subsampled ``x``) is built inside the conv's kernel by its prologue (see the conv epilogue
patterns). The arithmetic is the same: each output is one dot product over both inputs.

Preconditions: after the layout passes (any data/kernel layout), before the fusion patterns. Only
1x1 convs with constant weights, no padding or dilation, one group and equal layouts, output
shapes and dtypes are merged; a conv or bias add used anywhere else is left alone.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ._rewrite import rewrite_functions, static_shape, uses_of_values


@tvm.transform.module_pass(opt_level=0, name="MergeSummedConv")
class MergeSummedConv:
    """Merge ``conv1x1(a) [+ ba] + conv1x1(b) [+ bb]`` into one conv; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        convs = [is_op("relax.nn.conv2d")(wildcard(), is_const()) for _ in range(2)]
        biases = [is_const() for _ in range(2)]
        branches = [is_op("relax.add")(conv, bias) | conv for conv, bias in zip(convs, biases)]
        pattern = is_op("relax.add")(*branches)
        uses = uses_of_values(mod)

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            calls = [matches[conv] for conv in convs]
            bias_adds = [matches[b] for b, c in zip(branches, convs)
                         if not matches[b].same_as(matches[c])]
            if any(uses.get(call, 0) != 1 for call in calls + bias_adds) or not _mergeable(*calls):
                return expr
            attrs = calls[0].attrs
            channel = attrs.data_layout.index("C")
            spatial = [attrs.data_layout.index("H"), attrs.data_layout.index("W")]
            inputs = [_subsample(call.args[0], spatial, [int(s) for s in call.attrs.strides])
                      for call in calls]
            weight = np.concatenate([call.args[1].value.numpy() for call in calls],
                                    axis=attrs.kernel_layout.index("I"))
            merged = relax.op.nn.conv2d(
                relax.op.concat(inputs, axis=channel), relax.const(weight), strides=1, padding=0,
                dilation=1, groups=1, data_layout=attrs.data_layout,
                kernel_layout=attrs.kernel_layout, out_layout=attrs.out_layout,
                out_dtype=attrs.out_dtype)
            shifts = [matches[b].value.numpy() for b in biases if b in matches]
            if not shifts:
                return merged
            return relax.op.add(merged, relax.const(sum(shifts).astype(weight.dtype)))

        return rewrite_functions(mod, pattern, rewrite)


def _mergeable(a: relax.Call, b: relax.Call) -> bool:
    """Both are ungrouped, unpadded, undilated 1x1 convs with the same layouts, output and dtype."""
    for call in (a, b):
        attrs, weight = call.attrs, call.args[1].value
        kernel = attrs.kernel_layout
        if (int(attrs.groups) != 1 or any(int(p) for p in attrs.padding)
                or any(int(d) != 1 for d in attrs.dilation)
                or weight.shape[kernel.index("H")] != 1 or weight.shape[kernel.index("W")] != 1):
            return False
    layouts = {(str(c.attrs.data_layout), str(c.attrs.kernel_layout), str(c.attrs.out_layout),
                str(c.attrs.out_dtype), str(c.args[0].ty.dtype), c.args[1].value.dtype)
               for c in (a, b)}
    shapes = [static_shape(c.ty.shape) for c in (a, b)]
    static = all(static_shape(c.args[0].ty.shape) is not None for c in (a, b))
    return len(layouts) == 1 and static and shapes[0] is not None and shapes[0] == shapes[1]


def _subsample(data: relax.Expr, axes: list[int], strides: list[int]) -> relax.Expr:
    """What a 1x1 conv of ``strides`` reads of ``data``: every stride-th row and column."""
    if all(s == 1 for s in strides):
        return data
    shape = static_shape(data.ty.shape)
    return relax.op.strided_slice(data, axes, [0, 0], [shape[a] for a in axes], strides)
