"""SpaceToDepthConv: a strided NHWC conv over few input channels (an image model's stem: 7x7,
stride 2, 3 channels) computed as a stride-1 conv over its input rearranged space-to-depth.

On tensor cores a conv is an implicit GEMM whose K runs over the window's taps and, within a
tap, the input channels; the shared-memory copies read 8 channels (16 bytes) at a time. With 3
channels none of that holds: ResNet-50's stem was the slowest conv of the model on the GPU
(``tvmfuse inspect resnet50 --target cuda-sm90 --profile``). Rearranged, each ``s x s``
patch of the input becomes one pixel of ``s * s * Cp`` channels (``Cp`` the channels padded so
that this is a multiple of 8), and the ``KH x KW`` window with stride ``s`` becomes a
``ceil(KH / s) x ceil(KW / s)`` window with stride 1 over it (the taps past KH and KW have zero
weights). The stem: a 4x4 conv over 16 channels, K = 256 (147 real: 1.74x the multiplies, in
loads of 16 bytes and steps the tensor cores take whole).

Two kernels: the input transform (a TE kernel, tagged opaque so that it is stored once, not
recomputed in the conv's loads; it reads through the NCHW -> NHWC transpose and the cast before
it, so the model's input is read once) and the conv, whose epilogue (bias, ReLU) fuses as any
conv's. The weights are rearranged here, at build time. The sums are the same products as the
direct conv's plus zeros.

A rule of the rules file (``space_to_depth_conv``, on for ``[cuda]``).

Preconditions: after ConvertLayout to NHWC/OHWI and FoldConstant (the weight is a constant).
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax, te, tirx
from tvm.relax.dpl import is_const, is_op, wildcard

from ..names import OP_PATTERN, OPAQUE
from ._rewrite import calls_op, mutate_functions, static_shape

#: The PrimFunc name of the input transform.
INPUT_TRANSFORM = "space_to_depth"
#: Channels a tensor-core load reads at once (16 bytes of fp16): convs with a multiple of this
#: many input channels are left as they are.
VECTOR = 8
#: Precisions whose convs run on tensor cores, where the rewrite pays.
DTYPES = ("float16", "bfloat16")

_CONV = is_op("relax.nn.conv2d")(wildcard(), is_const())


def padded_channels(channels: int, stride: int) -> int:
    """The fewest channels >= ``channels`` whose ``stride x stride`` patch is whole vectors."""
    step = VECTOR // math.gcd(VECTOR, stride * stride)
    return -(-channels // step) * step


def transform_weight(weight: np.ndarray, stride: int, channels: int) -> np.ndarray:
    """OHWI ``[O, KH, KW, C]`` -> ``[O, ceil(KH/s), ceil(KW/s), s * s * Cp]``: tap ``(s i + a,
    s j + b)``, channel ``c`` at ``[i, j, (a s + b) Cp + c]``, zeros past KH, KW and C."""
    o, kh, kw, c = weight.shape
    th, tw = -(-kh // stride), -(-kw // stride)
    wide = np.zeros((o, th * stride, tw * stride, channels), weight.dtype)
    wide[:, :kh, :kw, :c] = weight
    wide = wide.reshape(o, th, stride, tw, stride, channels).transpose(0, 1, 3, 2, 4, 5)
    return np.ascontiguousarray(wide.reshape(o, th, tw, stride * stride * channels))


def input_transform(x: te.Tensor, nchw: bool, dtype: str, stride: int, channels: int,
                    top: int, left: int, out_hw: tuple[int, int]) -> te.Tensor:
    """``V[n, y, x, (a s + b) Cp + c] = X[n, s y + a - top, s x + b - left, c]`` (zero outside
    the image and past its channels), ``X`` read as NCHW where ``nchw`` (the transpose before
    the conv folded in) and cast to ``dtype``."""
    if nchw:
        n, c_in, h, w = (int(d) for d in x.shape)
    else:
        n, h, w, c_in = (int(d) for d in x.shape)

    def element(b_, y, x_, ch):
        a, b, c = ch // (stride * channels), ch // channels % stride, ch % channels
        row, col = stride * y + a - top, stride * x_ + b - left
        inside = tirx.all(row >= 0, row < h, col >= 0, col < w, c < c_in)
        value = x[b_, c, row, col] if nchw else x[b_, row, col, c]
        return tirx.if_then_else(inside, value.astype(dtype), tirx.const(0, dtype))

    return te.compute((n, *out_hw, stride * stride * channels), element, name=INPUT_TRANSFORM)


@tvm.transform.module_pass(opt_level=0, name="SpaceToDepthConv")
class SpaceToDepthConv:
    """Rewrite eligible strided convs; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return mutate_functions(mod, _Rewrite(mod))


def _eligible(call: relax.Call) -> int | None:
    """The stride of a conv this pass rewrites, else None."""
    attrs = call.attrs
    shape = static_shape(call.args[0].ty.shape)
    strides = [int(s) for s in attrs.strides]
    weight = call.args[1].value.shape
    if (shape is None or str(attrs.data_layout) != "NHWC" or str(attrs.kernel_layout) != "OHWI"
            or str(attrs.out_layout) not in ("NHWC", "") or int(attrs.groups) != 1
            or any(int(d) != 1 for d in attrs.dilation) or strides[0] != strides[1]
            or str(call.args[0].ty.dtype) not in DTYPES):
        return None
    stride = strides[0]
    if stride < 2 or shape[3] % VECTOR == 0 or min(weight[1:3]) <= stride:
        return None
    return stride


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not _CONV.match(call):
            return call
        stride = _eligible(call)
        if stride is None:
            return call
        return self._rewrite(call, stride)

    def _source(self, data: relax.Expr) -> tuple[relax.Expr, bool]:
        """What the transform reads: below ``data``, a transpose of an NCHW tensor to NHWC
        (``nchw``), and below that a cast, both folded into the transform."""
        nchw = False
        value = self._bound(data)
        axes = value.attrs.axes if calls_op(value, "relax.permute_dims") else None
        if axes is not None and [int(a) for a in axes] == [0, 2, 3, 1]:
            data, nchw = value.args[0], True
            value = self._bound(data)
        if calls_op(value, "relax.astype") and static_shape(value.args[0].ty.shape) is not None:
            data = value.args[0]
        return data, nchw

    def _bound(self, expr: relax.Expr) -> relax.Expr:
        """The value bound to ``expr`` in the function being rewritten (``expr`` itself where
        it is not a variable bound there)."""
        return self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr

    def _rewrite(self, call: relax.Call, stride: int) -> relax.Expr:
        attrs = call.attrs
        data = call.args[0]
        weight = call.args[1].value.numpy()
        channels = padded_channels(int(weight.shape[3]), stride)
        top, left, bottom, right = (int(p) for p in attrs.padding)
        _, h, w, _ = static_shape(data.ty.shape)
        kh, kw = int(weight.shape[1]), int(weight.shape[2])
        out_h = (h + top + bottom - kh) // stride + 1
        out_w = (w + left + right - kw) // stride + 1
        out_hw = (out_h - 1 + -(-kh // stride), out_w - 1 + -(-kw // stride))
        source, nchw = self._source(data)
        dtype = str(data.ty.dtype)
        x = te.placeholder(source.ty.shape.values, source.ty.dtype, "data")
        v = input_transform(x, nchw, dtype, stride, channels, top, left, out_hw)
        func = te.create_prim_func([x, v]).with_attr(OP_PATTERN, OPAQUE)
        gvar = self.builder_.add_func(func, INPUT_TRANSFORM)
        # its own symbol (TE names every function "main", as the Relax entry is)
        self.builder_.update_func(gvar, func.with_attr("global_symbol", gvar.name_hint))
        v = self.builder_.emit(relax.call_tir(
            gvar, [source], relax.TensorType([int(d) for d in v.shape], dtype)))
        return relax.op.nn.conv2d(
            v, relax.const(transform_weight(weight, stride, channels)), strides=1, padding=0,
            data_layout="NHWC", kernel_layout="OHWI", out_layout="NHWC",
            out_dtype=attrs.out_dtype)
