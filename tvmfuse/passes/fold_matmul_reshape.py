"""FoldMatmulReshape: drop the reshapes torch.export puts around a linear layer's matmul.

``reshape(matmul(reshape(x, [M, K]), W) [+ b], [..., N])`` with ``x`` of shape ``[..., K]`` and
``M`` the product of its leading dims becomes ``matmul(x, W) [+ b]``: Relax's matmul broadcasts
over leading dims. Without this, the reshape after the matmul is an injective op that FuseOps
cannot put into the matmul's kernel, so the bias, activation and residual add each stay apart.

Preconditions: imported Relax, before LegalizeOps. Symbolic dimensions (``--dynamic``) are
folded where the shapes provably agree.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ._rewrite import dims_equal, dims_of, rewrite_functions, shapes_equal


@tvm.transform.module_pass(opt_level=0, name="FoldMatmulReshape")
class FoldMatmulReshape:
    """Rewrite reshape-matmul-reshape chains into one N-D matmul; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        x, weight, bias = wildcard(), wildcard(), wildcard()
        matmul = is_op("relax.matmul")(is_op("relax.reshape")(x, wildcard()), weight)
        with_bias = is_op("relax.add")(matmul, bias)
        pattern = is_op("relax.reshape")(with_bias | matmul, wildcard())

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            x_shape, w_shape = dims_of(matches[x]), dims_of(matches[weight])
            out_shape = dims_of(expr)
            if x_shape is None or w_shape is None or out_shape is None or len(w_shape) != 2:
                return expr
            flat = dims_of(matches[matmul].args[0])
            if (len(x_shape) < 3 or not shapes_equal(flat, [math.prod(x_shape[:-1]), x_shape[-1]])
                    or not shapes_equal(out_shape, [*x_shape[:-1], w_shape[1]])):
                return expr
            call = matches[matmul]
            result = relax.Call(call.op, [matches[x], matches[weight]], call.attrs)
            if with_bias in matches:
                b_shape = dims_of(matches[bias])
                if b_shape is None or not dims_equal(math.prod(b_shape), w_shape[1]):
                    return expr  # not a per-column bias: it may not broadcast the same way
                result = relax.op.add(result, matches[bias])
            return result

        return rewrite_functions(mod, pattern, rewrite)
