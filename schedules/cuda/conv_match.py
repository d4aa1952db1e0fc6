"""NHWC convs read as the wgmma kernel's implicit GEMM (:func:`match_conv`): the window's taps,
strides, dilation and zero padding read off a fused conv's indices into a :class:`ConvGeometry`."""

from __future__ import annotations

import math

import tvm

from .gemm_match import (
    GemmMatch,
    fused_blocks,
    inline_blocks,
    is_identity,
    match_epilogue,
    rebuild,
)
from .wgmma_tile import BLOCK_K, ConvGeometry


def match_conv(func: tvm.tirx.PrimFunc, in_dtype: str = "float16") -> GemmMatch | None:
    """The conv ``func`` computes, if the wgmma kernel takes it as an implicit GEMM: an NHWC
    conv (``C[n, h, w, o] += X'[n, h * sh + ry * dh, w * sw + rx * dw, c] * W[o, ry, rx, c]``)
    of ``in_dtype`` parameters summed in float32, X' the input X or X zero-padded (a block
    ``X'[n, h, w, c] = if_then_else(inside, X[n, h - top, w - left, c], 0)``), channels a
    multiple of 8 (at least 64 where the window has several taps), strides up to 4, then an
    elementwise epilogue as :func:`match_gemm`'s."""
    fused = fused_blocks(func, keep_producers=True)
    if fused is None:
        return None
    sch, matmul = fused
    found = _conv(sch, matmul, func.params, in_dtype)
    if found is None:
        return None
    x, weight, accumulator, spatial, geometry = found
    if not inline_blocks(sch, matmul, func.params[-1]):  # the padding, read off above
        return None
    epilogue = match_epilogue(sch, matmul, func.params[-1], accumulator, spatial)
    if epilogue is None:
        return None
    n = int(spatial[-1].dom.extent)
    return GemmMatch(func, x, weight, func.params[-1], math.prod(
        int(iv.dom.extent) for iv in spatial[:-1]), n, math.prod(int(d) for d in weight.shape[1:]),
        False, *epilogue, accumulator, conv=geometry)


def _conv(sch, block_rv, params, in_dtype: str):
    """``(X, W, C, spatial iterators, ConvGeometry)`` of the NHWC conv block (see
    :func:`match_conv`), else None."""
    block = sch.get(block_rv)
    store = block.body
    spatial = [iv for iv in block.iter_vars if iv.iter_type == tvm.tirx.IterVar.DataPar]
    reduce = [iv for iv in block.iter_vars if iv.iter_type != tvm.tirx.IterVar.DataPar]
    if (not isinstance(store, tvm.tirx.BufferStore) or len(spatial) != 4 or len(reduce) != 3
            or str(store.buffer.dtype) != "float32"
            or not is_identity(store.indices, [iv.var for iv in spatial])
            or not isinstance(store.value, tvm.ir.prim.expr.Add)
            or not isinstance(store.value.b, tvm.ir.prim.expr.Mul)):
        return None
    loads = []
    for operand in (store.value.b.a, store.value.b.b):
        if not isinstance(operand, tvm.ir.prim.expr.Cast) or not isinstance(
                operand.value, tvm.ir.TensorLoad) or str(operand.value.source.dtype) != in_dtype:
            return None
        loads.append(operand.value)
    (b, h, w, o), (ry, rx, rc) = ([iv.var for iv in ivs] for ivs in (spatial, reduce))
    source, weight = (load.source for load in loads)
    if not any(weight.same_as(p) for p in params) or not is_identity(
            loads[1].indices, [o, ry, rx, rc]):
        return None
    x, padding = _unpadded(sch, source, params)
    if x is None or str(x.dtype) != in_dtype:
        return None
    # X'[b, h * sh + ry * dh, w * sw + rx * dw, c]: the coefficients read off the indices
    analyzer = tvm.sym.Analyzer()
    coefficients = []
    for index, out_var, window_var in ((loads[0].indices[1], h, ry), (loads[0].indices[2], w, rx)):
        stride, dilation = (_coefficient(index, var, (b, h, w, o, ry, rx, rc))
                            for var in (out_var, window_var))
        if (None in (stride, dilation) or not 1 <= stride <= 4 or dilation < 1
                or not analyzer.can_prove_equal(index, out_var * stride + window_var * dilation)):
            return None
        coefficients.append((stride, dilation))
    if not (is_identity([loads[0].indices[0], loads[0].indices[3]], [b, rc])):
        return None
    batch, height, width, channels = (int(d) for d in x.shape)
    if channels % 8 or [int(d) for d in weight.shape[1:]] != [
            int(iv.dom.extent) for iv in reduce] or int(weight.shape[-1]) != channels:
        return None
    # a tap's channels are one pipeline step of 64 (zeros past C): over fewer channels the
    # steps are mostly zeros, where mma.sync's steps run over taps and channels together (the
    # space-to-depth stem: 16 channels, 4x4 taps)
    if channels < BLOCK_K and int(reduce[0].dom.extent) * int(reduce[1].dom.extent) > 1:
        return None
    geometry = ConvGeometry(
        batch, height, width, channels, int(spatial[1].dom.extent), int(spatial[2].dom.extent),
        window=(int(reduce[0].dom.extent), int(reduce[1].dom.extent)),
        stride=(coefficients[0][0], coefficients[1][0]),
        dilation=(coefficients[0][1], coefficients[1][1]), padding=padding)
    return x, weight, store.buffer, spatial, geometry


def _unpadded(sch, source: tvm.tirx.Buffer, params):
    """``(X, (top, left))`` where ``source`` is the parameter X, or X zero-padded by the one
    block writing ``source`` (topi's pad: ``if_then_else(inside, X[n, h - top, w - left, c],
    0)``, ``inside`` the bounds of X, which TMA's zero fill reproduces); ``(None, None)``."""
    if any(source.same_as(p) for p in params):
        return source, (0, 0)
    writers = [blk for blk in sch.get_child_blocks(sch.get_sblock("root"))
               if any(w.source.same_as(source) for w in sch.get(blk).writes)]
    if len(writers) != 1:
        return None, None
    stmt = sch.get(writers[0])
    store, iters = stmt.body, [iv.var for iv in stmt.iter_vars]
    if not isinstance(store, tvm.tirx.BufferStore) or not is_identity(store.indices, iters):
        return None, None
    value, inside = store.value, None
    if isinstance(value, tvm.ir.Call) and value.op.same_as(tvm.ir.Op.get("prim.if_then_else")):
        inside, value, zero = value.args
        if not isinstance(zero, tvm.tirx.FloatImm) or zero.value != 0:
            return None, None
    if not isinstance(value, tvm.ir.TensorLoad) or not any(
            value.source.same_as(p) for p in params) or len(iters) != 4:
        return None, None
    offsets = [_coefficient(index, None, iters) for index in value.indices]
    analyzer = tvm.sym.Analyzer()
    if None in offsets or offsets[0] or offsets[3] or not all(
            analyzer.can_prove_equal(index, var - offset)
            for index, var, offset in zip(value.indices, iters, (0, offsets[1], offsets[2], 0))):
        return None, None
    if inside is not None:
        # the zeros must be exactly where X is not: TMA fills zeros there and reads X elsewhere
        for iv in stmt.iter_vars:
            analyzer.bind(iv.var, tvm.ir.Range.from_min_extent(iv.dom.min, iv.dom.extent))
        (_, height, width, _), (_, h, w, _) = value.source.shape, iters
        within = tvm.tirx.all(offsets[1] <= h, h < offsets[1] + height,
                              offsets[2] <= w, w < offsets[2] + width)
        if not analyzer.can_prove(tvm.tirx.EQ(inside, within)):
            return None, None
    return value.source, (offsets[1], offsets[2])


def _coefficient(index, var, variables) -> int | None:
    """The coefficient of ``var`` in the affine ``index`` (``var`` None: minus its constant
    term), found by evaluating it with ``variables`` at 0 and ``var`` at 1; None where that is
    not a constant."""
    point = {v: tvm.tirx.const(1 if var is not None and v.same_as(var) else 0, v.ty)
             for v in variables}
    at = tvm.sym.Analyzer().simplify(rebuild(index, lambda load: None, point))
    if not isinstance(at, tvm.tirx.IntImm):
        return None
    return int(at.value) if var is not None else -int(at.value)
