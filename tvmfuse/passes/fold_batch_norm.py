"""FoldBatchNorm: fold inference BatchNorm into the weights and bias of the conv2d before it.

``batch_norm(conv2d(x, W) [+ b])[0]`` becomes ``conv2d(x, W * s) + (beta + (b - mean) * s)`` with
``s = gamma / sqrt(var + eps)``, computed once at compile time. What is left (conv, bias add, and
the activation after it) then fuses into one kernel, which reads no BatchNorm tensors at all.

Preconditions: run on imported Relax, before DecomposeOpsForInference and LegalizeOps. Only
constant weights and statistics, NCHW data, OIHW kernels and BatchNorm on axis 1 are folded; every
other conv/BatchNorm pair is left as it is.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, is_tuple_get_item, wildcard

from ._rewrite import rewrite_functions


@tvm.transform.module_pass(opt_level=0, name="FoldBatchNorm")
class FoldBatchNorm:
    """Fold ``batch_norm(conv2d(...))`` into the conv's constants; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        data, weight, bias = wildcard(), is_const(), is_const()
        conv = is_op("relax.nn.conv2d")(data, weight)
        conv_bias = is_op("relax.add")(conv, bias)
        gamma, beta, mean, var = is_const(), is_const(), is_const(), is_const()
        bn = is_op("relax.nn.batch_norm")(conv | conv_bias, gamma, beta, mean, var)
        pattern = is_tuple_get_item(bn, 0)

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            conv_call, bn_call = matches[conv], matches[bn]
            attrs = conv_call.attrs
            if (int(bn_call.attrs.axis) != 1 or attrs.data_layout != "NCHW"
                    or attrs.kernel_layout != "OIHW" or attrs.out_layout != "NCHW"):
                return expr
            w = matches[weight].value.numpy()
            channels = w.shape[0]
            b = matches[bias].value.numpy().reshape(-1) if bias in matches else 0.0
            if np.ndim(b) and b.shape != (channels,):
                return expr  # a bias add that does not broadcast per output channel
            scale = matches[gamma].value.numpy() / np.sqrt(
                matches[var].value.numpy() + float(bn_call.attrs.epsilon)
            )
            shift = matches[beta].value.numpy() + (b - matches[mean].value.numpy()) * scale
            dtype = w.dtype
            new_weight = relax.const((w * scale.reshape(-1, 1, 1, 1)).astype(dtype))
            new_bias = relax.const(shift.reshape(1, channels, 1, 1).astype(dtype))
            folded = relax.Call(conv_call.op, [matches[data], new_weight], attrs)
            return relax.op.add(folded, new_bias)

        return rewrite_functions(mod, pattern, rewrite)
