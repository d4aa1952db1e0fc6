"""PointConvAsMatmul: a 1x1 conv over a 1x1 map (squeeze-and-excitation's two layers) is a
matmul of the input's channels with the weight.

A conv's rows are the output's columns, and a map of one pixel leaves the register tile one row
and nothing to pad (a conv is not an einsum: see ``schedules/cpu/_blocked.py``): RegNet-Y's 440
-> 110 excitation layers, whose 110 outputs no vector divides, fell to the catch-all schedule
(3-4% of the model's time for a sliver of its work). As ``[N, 1, 1, C] @ [C, O]`` the GEMM
schedule pads the columns to whole vectors, and the bias and activation after it fuse as a
linear layer's.

Preconditions: after the layout passes (NHWC data, HWIO or OHWI weights), before the fusion
patterns.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ._rewrite import rewrite_functions, static_shape


@tvm.transform.module_pass(opt_level=0, name="PointConvAsMatmul")
class PointConvAsMatmul:
    """Rewrite 1x1 convs over 1x1 NHWC maps as matmuls; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        x, weight = wildcard(), wildcard()
        pattern = is_op("relax.nn.conv2d")(x, weight)

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            attrs = expr.attrs
            data, kernel = static_shape(matches[x].ty.shape), static_shape(matches[weight].ty.shape)
            layout = str(attrs.kernel_layout)
            if (data is None or kernel is None or str(attrs.data_layout) != "NHWC"
                    or str(attrs.out_layout) != "NHWC" or layout not in ("HWIO", "OHWI")
                    or data[1:3] != [1, 1] or int(attrs.groups) != 1
                    or any(int(p) for p in attrs.padding)):
                return expr
            if layout == "HWIO":
                if kernel[:2] != [1, 1]:
                    return expr
                matrix = relax.op.reshape(matches[weight], kernel[2:])
            else:
                if kernel[1:3] != [1, 1]:
                    return expr
                matrix = relax.op.permute_dims(
                    relax.op.reshape(matches[weight], [kernel[0], kernel[3]]), [1, 0])
            return relax.op.matmul(matches[x], matrix, out_dtype=attrs.out_dtype)

        return rewrite_functions(mod, pattern, rewrite)
