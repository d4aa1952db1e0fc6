"""WinogradConv2D: 3x3 stride-1 NHWC convs with constant weights computed as Winograd F(2x2, 3x3).

Each 4x4 input tile ``d`` (stride 2) gives a 2x2 output tile ``A^T [(G w G^T) * (B^T d B)] A``:
16 multiplies per 2x2 outputs and input channel instead of 36. Three steps, each one kernel after
fusion:

1. the input transform (a TE kernel, padding read through): ``V [16, P, C] = B^T d B`` for each
   of the ``P`` = batch x tiles tiles;
2. the 16 products, one batched matmul (a Relax op, so the dense schedule and MetaSchedule take
   it, with its weights packed like any GEMM's) with the weights transformed here, at build time:
   ``M = V @ U``, ``U = G w G^T [16, C, K]``;
3. the output transform (a TE kernel): ``Y = A^T M A`` for each tile, written straight into the
   NHWC image (odd heights and widths cropped); the conv's epilogue (bias, residual, ReLU) is
   elementwise after it and fuses into it.

Both transforms are written without reductions, as sums of +-1 terms selected by the position in
the tile, so that a schedule can unroll them into adds (schedules/cpu/winograd.py) and the output
transform is an injective kernel that FuseOps joins the epilogue to. The input transform is
tagged opaque: FuseOps would otherwise inline what feeds it (another Winograd conv's output
transform and ReLU) and compute it again for each of the 4 tiles that read a value.

A rule of the rules file (``winograd_conv2d``, on for ``[avx512]`` where it was measured): the
2.25x fewer multiplies have to pay for writing and reading ``V`` and ``M`` (4x the input and the
output) and for weights 16/9 the size, so only convs with enough tiles and channels are rewritten
(:data:`MIN_TILES`, :data:`MIN_CHANNELS`). On ResNet-50 that is the 11 stride-1 3x3 convs from
56x56 to 14x14, and the model runs a tenth faster. The arithmetic differs
from a direct conv by float rounding only (relative error about 1e-7).

Preconditions: after ConvertLayout to NHWC/HWIO and FoldConstant; before the fusion patterns.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, tirx
from tvm.relax.dpl import is_const, is_op, wildcard

from ..names import OP_PATTERN, OPAQUE, WINOGRAD_INPUT, WINOGRAD_OUTPUT
from ._rewrite import mutate_functions, static_shape

_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], "float64")
_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], "float64")
_AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], "float64")

#: Fewest tiles (batch x ceil(H/2) x ceil(W/2)) worth transforming: the batched matmul reads each
#: transformed weight once per tile, and ``U`` is 16/9 the direct weights' size. ResNet-50's 7x7
#: stage (16 tiles) streams its 16 MB ``U`` from memory and runs slower than the direct conv; its
#: 14x14 stage (49 tiles) runs a third faster (``tvmfuse inspect resnet50 --profile``).
MIN_TILES = 32

#: Fewest input and output channels worth transforming: the matmul's reduction and columns. A
#: Conv-BN-ReLU 1x1 -> 3x3 -> 1x1 block over C channels (56x56 and 28x28, NHWC) runs as fast or
#: slower with Winograd at 8 and 16 channels, and faster from 32 on (9-13% at 32, 20-30% at 64-128).
MIN_CHANNELS = 32

#: The PrimFunc names of the two transforms (the kernels FuseTIR makes of them start with these).
INPUT_TRANSFORM = "winograd_input_transform"
OUTPUT_TRANSFORM = "winograd_output_transform"


def transform_weight(weight: np.ndarray) -> np.ndarray:
    """HWIO 3x3 weights ``[3, 3, C, K]`` -> ``U [16, C, K]``, ``U[4i + j] = (G w G^T)[i, j]``."""
    u = np.einsum("ia,jb,abck->ijck", _G, _G, weight.astype("float64"))
    return u.reshape(16, *weight.shape[2:]).astype(weight.dtype)


@tvm.transform.module_pass(opt_level=0, name="WinogradConv2D")
class WinogradConv2D:
    """Rewrite eligible convs into Winograd F(2x2, 3x3); see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return mutate_functions(mod, _Rewrite(mod))


_CONV = is_op("relax.nn.conv2d")(wildcard(), is_const())


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not _CONV.match(call):
            return call
        shape = static_shape(call.args[0].ty.shape)
        if shape is None or not _eligible(call, shape):
            return call
        return _winograd(self.builder_, call.args[0], call.args[1].value.numpy(), shape)


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
            and str(attrs.out_dtype) in ("float32", "")
            and _tiles(shape) >= MIN_TILES
            and min(shape[3], int(weight[3])) >= MIN_CHANNELS)


def _tiles(shape: list[int]) -> int:
    """How many 2x2 output tiles an NHWC image of ``shape`` has."""
    n, h, w, _ = shape
    return n * ((h + 1) // 2) * ((w + 1) // 2)


def _winograd(builder: relax.BlockBuilder, x: relax.Expr, weight: np.ndarray,
              shape: list[int]) -> relax.Expr:
    data = te.placeholder(x.ty.shape.values, x.ty.dtype, "data")  # int64, as LegalizeOps
    v = input_transform(data)
    transform = te.create_prim_func([data, v]).with_attr(OP_PATTERN, OPAQUE)
    v = builder.emit(relax.call_tir(builder.add_func(transform, INPUT_TRANSFORM), [x],
                                    relax.TensorType(v.shape, v.dtype)))
    m = builder.emit(relax.op.matmul(v, relax.const(transform_weight(weight))))
    return builder.call_te(output_transform, m, shape[1], shape[2],
                           primfunc_name_hint=OUTPUT_TRANSFORM)


def _bilinear(left: np.ndarray, i: int, right: np.ndarray, j: int, term) -> tirx.PrimExpr:
    """``sum_ab left[i, a] right[j, b] term(a, b)`` over the nonzero coefficients, which are all
    +-1 here: adds and subtracts, no multiplies."""
    total = None
    for a in range(left.shape[1]):
        for b in range(right.shape[1]):
            coefficient = left[i, a] * right[j, b]
            if coefficient == 0:
                continue
            assert abs(coefficient) == 1
            value = term(a, b)
            if total is None:
                total = value if coefficient > 0 else -value
            else:
                total = total + value if coefficient > 0 else total - value
    return total


def _select(index: tirx.PrimExpr, cases: list[tirx.PrimExpr]) -> tirx.PrimExpr:
    """``cases[index]``: a chain of selects, which folds to one case once ``index`` is a
    constant (an unrolled loop: see schedules/cpu/winograd.py)."""
    value = cases[-1]
    for case in range(len(cases) - 2, -1, -1):
        value = tirx.Select(index == case, cases[case], value)
    return value


def input_transform(x: te.Tensor) -> te.Tensor:
    """``V[4i + j, p, c] = (B^T d_p B)[i, j]``, ``d_p`` the 4x4 tile ``p`` of ``x`` padded by one
    (tile ``(ty, tx)`` starts at row ``2 ty - 1``, column ``2 tx - 1``)."""
    n, h, w, _ = (int(d) for d in x.shape)
    th, tw = (h + 1) // 2, (w + 1) // 2

    def element(e, p, ch):
        batch, ty, tx = p // (th * tw), p // tw % th, p % tw

        def tile(a, b):
            row, col = 2 * ty + a - 1, 2 * tx + b - 1
            return tirx.if_then_else(tirx.all(row >= 0, row < h, col >= 0, col < w),
                                     x[batch, row, col, ch], tirx.const(0.0, x.dtype))

        return _select(e, [_bilinear(_BT, i, _BT, j, tile) for i in range(4) for j in range(4)])

    return te.compute((16, n * th * tw, int(x.shape[3])), element, name=WINOGRAD_INPUT)


def output_transform(m: te.Tensor, h: int, w: int) -> te.Tensor:
    """``Y[n, y, x, k] = (A^T M_p A)[y % 2, x % 2]``, ``M_p[a, b] = M[4a + b, p, k]`` and ``p``
    the tile of ``(n, y // 2, x // 2)``."""
    th, tw = (h + 1) // 2, (w + 1) // 2
    n = int(m.shape[1]) // (th * tw)

    def element(batch, y, x, ch):
        p = batch * th * tw + y // 2 * tw + x // 2
        cases = [_bilinear(_AT, i, _AT, j, lambda a, b: m[4 * a + b, p, ch])
                 for i in range(2) for j in range(2)]
        return _select(y % 2 * 2 + x % 2, cases)

    return te.compute((n, h, w, int(m.shape[2])), element, name=WINOGRAD_OUTPUT)
