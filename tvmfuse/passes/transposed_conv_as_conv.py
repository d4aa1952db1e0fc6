"""TransposedConvAsConv: a transposed conv is a conv over its input dilated by the stride.

``ConvTranspose2d`` (DPT's reassemble stage, segmentation and generative decoders) imports as
``nn.conv2d_transpose``, which the CPU strategy's layout passes and conv schedules do not know:
left to TVM it had no lowering once the layouts were converted. Written as a plain conv it takes
the conv path (NHWC, packed weights, the conv schedules and their epilogues). For stride ``s``,
kernel ``k``, dilation ``d``, padding ``p`` and output padding ``q`` on each spatial axis, the
transposed conv equals a stride-1 conv with dilation ``d`` over the input with ``s - 1`` zeros
between pixels, padded by ``d * (k - 1) - p`` (plus ``q`` on the high side; a negative padding
crops), with the weight flipped spatially and its in/out channels swapped within each group. The
zeros are placed by a reshape to ``[..., H, 1, W, 1]``, a pad to ``[..., H, s, W, s]`` and a
reshape back; the weight's reshapes, transpose and flips fold at build time when it is a constant.
``conv1d_transpose`` becomes a ``conv1d`` the same way (Conv1DAsConv2D takes it from there).

Preconditions: imported Relax (NCHW/IOHW or NCW/IOW, static channel and kernel sizes), before
Conv1DAsConv2D, FoldConstant and the layout passes.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ._rewrite import dims_of, rewrite_functions, static_shape

#: Transposed conv -> (its conv, data layout, kernel layout) for each spatial rank handled.
_CONVS = {
    "relax.nn.conv2d_transpose": (relax.op.nn.conv2d, "NCHW", "IOHW"),
    "relax.nn.conv1d_transpose": (relax.op.nn.conv1d, "NCW", "IOW"),
}


@tvm.transform.module_pass(opt_level=0, name="TransposedConvAsConv")
class TransposedConvAsConv:
    """Rewrite conv2d_transpose / conv1d_transpose as conv2d / conv1d over a zero-dilated input;
    see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        x, weight = wildcard(), wildcard()
        pattern = (is_op("relax.nn.conv2d_transpose")(x, weight)
                   | is_op("relax.nn.conv1d_transpose")(x, weight))

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            conv, data_layout, kernel_layout = _CONVS[expr.op.name]
            attrs = expr.attrs
            data, kernel = dims_of(matches[x]), static_shape(matches[weight].ty.shape)
            if (data is None or kernel is None or str(attrs.data_layout) != data_layout
                    or str(attrs.kernel_layout) != kernel_layout
                    or str(attrs.out_layout) != data_layout):
                return expr
            rank = len(kernel) - 2
            strides = [int(s) for s in attrs.strides]
            dilation = [int(d) for d in attrs.dilation]
            padding = [int(p) for p in attrs.padding]
            extra = [int(q) for q in attrs.output_padding]
            groups = int(attrs.groups)
            dilated = _dilate(matches[x], data, strides)
            # Padding of the dilated input (which ends in s - 1 zeros of its own) on each side.
            low = [dilation[i] * (kernel[2 + i] - 1) - padding[i] for i in range(rank)]
            high = [dilation[i] * (kernel[2 + i] - 1) - padding[rank + i] + extra[i]
                    - (strides[i] - 1) for i in range(rank)]
            if min(low + high) < 0:
                sizes = [data[2 + i] * strides[i] for i in range(rank)]
                dilated = relax.op.strided_slice(
                    dilated, axes=list(range(2, 2 + rank)),
                    begin=[max(0, -lo) for lo in low],
                    end=[size - max(0, -hi) for size, hi in zip(sizes, high)])
            return conv(dilated, _as_conv_weight(matches[weight], kernel, groups), strides=1,
                        padding=[max(0, p) for p in low + high], dilation=dilation,
                        groups=groups, data_layout=data_layout, kernel_layout="OI" + "HW"[-rank:],
                        out_dtype=attrs.out_dtype)

        return rewrite_functions(mod, pattern, rewrite)


def _dilate(data: relax.Expr, dims: list, strides: list[int]) -> relax.Expr:
    """``data`` (N, C, spatial...) with ``stride - 1`` zeros after each pixel of each spatial
    axis: every spatial axis gets a unit axis after it, padded to the stride, and is merged
    with it."""
    if all(s == 1 for s in strides):
        return data
    split, merged, widths = list(dims[:2]), list(dims[:2]), [0, 0, 0, 0]
    for size, stride in zip(dims[2:], strides):
        split += [size, 1]
        merged.append(size * stride)
        widths += [0, 0, 0, stride - 1]
    padded = relax.op.nn.pad(relax.op.reshape(data, split), widths)
    return relax.op.reshape(padded, merged)


def _as_conv_weight(weight: relax.Expr, kernel: list[int], groups: int) -> relax.Expr:
    """The transposed conv's weight (in, out / groups, k...) as the equivalent conv's
    (out, in / groups, k...): in/out swapped within each group, flipped on each spatial axis."""
    channels_in, out_per_group, spatial = kernel[0], kernel[1], kernel[2:]
    in_per_group = channels_in // groups
    grouped = relax.op.reshape(weight, [groups, in_per_group, out_per_group, *spatial])
    axes = [0, 2, 1, *range(3, 3 + len(spatial))]
    swapped = relax.op.reshape(relax.op.permute_dims(grouped, axes),
                               [groups * out_per_group, in_per_group, *spatial])
    for axis in range(2, 2 + len(spatial)):
        swapped = relax.op.flip(swapped, axis)
    return swapped
