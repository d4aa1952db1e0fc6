"""WinogradConv2D: 3x3 stride-1 NHWC convs with constant weights computed as Winograd F(2x2, 3x3).

Each 4x4 input tile ``d`` (stride 2) gives a 2x2 output tile ``A^T [(G w G^T) * (B^T d B)] A``:
16 multiplies per output pair of rows and columns instead of 36. Written as Relax ops, so the
pipeline's own schedules take every step:

1. pad, then the 16 tile positions as strided slices stacked into ``D [16, P, C]``
   (``P`` = batch x tiles);
2. the input transform, one GEMM: ``V = kron(B^T, B^T) [16, 16] @ D``;
3. the 16 products, one batched GEMM with the weights transformed here, at build time:
   ``M = V @ U``, ``U = kron(G, G) w [16, C, K]``;
4. the output transform, one GEMM: ``Y = kron(A^T, A^T) [4, 16] @ M``, then the 2x2 tiles back
   into the NHWC image (cropped when H or W is odd).

A rule of the rules file (``winograd_conv2d``, off by default): on the 2-core Zen 4 machine the
direct NHWC schedule already runs ResNet-50's 3x3 convs at 170-220 GFLOP/s, and Winograd's extra
passes over memory (the stacked tiles are 4x the input) must be paid out of its 2.25x fewer
multiplies; measure with ``tvmfuse bench`` before switching it on. The arithmetic differs from a
direct conv by float rounding only (relative L2 error about 1e-7 in the tests).

Preconditions: after ConvertLayout to NHWC/HWIO and FoldConstant; before the fusion patterns.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ._rewrite import rewrite_functions, static_shape

_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], "float64")
_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], "float64")
_AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], "float64")


def transform_weight(weight: np.ndarray) -> np.ndarray:
    """HWIO 3x3 weights ``[3, 3, C, K]`` -> ``U [16, C, K]``, ``U[4i + j] = (G w G^T)[i, j]``."""
    u = np.einsum("ia,jb,abck->ijck", _G, _G, weight.astype("float64"))
    return u.reshape(16, *weight.shape[2:]).astype(weight.dtype)


@tvm.transform.module_pass(opt_level=0, name="WinogradConv2D")
class WinogradConv2D:
    """Rewrite eligible convs into Winograd F(2x2, 3x3); see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        pattern = is_op("relax.nn.conv2d")(wildcard(), is_const())

        def rewrite(expr: relax.Expr, _matches) -> relax.Expr:
            x, weight = expr.args
            shape = static_shape(x.ty.shape)
            if shape is None or not _eligible(expr, shape):
                return expr
            return _winograd(x, weight.value.numpy(), shape)

        return rewrite_functions(mod, pattern, rewrite)


def _eligible(call: relax.Call, shape: list[int]) -> bool:
    attrs = call.attrs
    weight = call.args[1].value.shape
    return (str(attrs.data_layout) == "NHWC" and str(attrs.kernel_layout) == "HWIO"
            and str(attrs.out_layout) in ("NHWC", "")
            and [int(s) for s in attrs.strides] == [1, 1]
            and [int(p) for p in attrs.padding] == [1, 1, 1, 1]
            and [int(d) for d in attrs.dilation] == [1, 1] and int(attrs.groups) == 1
            and tuple(weight[:2]) == (3, 3) and len(shape) == 4
            and str(call.args[0].ty.dtype) == "float32"
            and str(attrs.out_dtype) in ("float32", ""))


def _winograd(x: relax.Expr, weight: np.ndarray, shape: list[int]) -> relax.Expr:
    n, h, w, c = shape
    k = weight.shape[3]
    th, tw = (h + 1) // 2, (w + 1) // 2
    tiles = n * th * tw
    op = relax.op
    padded = op.nn.pad(x, [0, 0, 1, 1 + 2 * th - h, 1, 1 + 2 * tw - w, 0, 0])
    slices = [op.reshape(op.strided_slice(padded, axes=[1, 2], begin=[xi, nu],
                                          end=[xi + 2 * th - 1, nu + 2 * tw - 1],
                                          strides=[2, 2]), [1, tiles * c])
              for xi in range(4) for nu in range(4)]
    d = op.concat(slices, axis=0)  # [16, P*C]
    v = op.reshape(op.matmul(relax.const(np.kron(_BT, _BT).astype("float32")), d),
                   [16, tiles, c])
    m = op.matmul(v, relax.const(transform_weight(weight)))  # [16, P, K]
    y = op.matmul(relax.const(np.kron(_AT, _AT).astype("float32")),
                  op.reshape(m, [16, tiles * k]))  # [4, P*K]
    y = op.permute_dims(op.reshape(y, [2, 2, n, th, tw, k]), [2, 3, 0, 4, 1, 5])
    y = op.reshape(y, [n, 2 * th, 2 * tw, k])
    if 2 * th != h or 2 * tw != w:
        y = op.strided_slice(y, axes=[1, 2], begin=[0, 0], end=[h, w])
    return y
