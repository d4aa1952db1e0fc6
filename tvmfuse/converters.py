"""Converters of ATen ops for TVM's torch.export importer (its ``custom_convert_map``): ops it
has no converter for, and ops it converts wrongly. Each takes the FX node and the importer and
returns the Relax value (or, for complex tensors, a :class:`Complex` pair the converters of the
complex ops pass between them: Relax has no complex dtype)."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from tvm import relax


def _reduction(op):
    """A converter of a torch reduction ``(x, dim=[], keepdim=False)`` (an empty ``dim``: every
    axis) to the Relax reduction ``op``."""

    def convert(node, importer):
        x = importer.env[node.args[0]]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", ())
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        dim = [dim] if isinstance(dim, int) else list(dim)
        return importer.block_builder.emit(op(x, dim or None, keepdims=keepdim))

    return convert


def _index(node, importer):
    """``aten.index.Tensor`` (``x[idx...]``, a None for each ``:``) with PyTorch's placement of the
    indexed dimensions: the index tensors broadcast together, and their dimensions stand where
    the first indexed axis stood when the indexed axes are adjacent, else in front. TVM's
    importer turns each None before an index into an ``arange`` that broadcasts against the
    index tensors' first axis (ConvBERT's unfold, ``x[:, :, rows(9, 8, 1, 1), cols(1, 1)]``:
    "cannot broadcast index shapes ... 32 vs 9"); here the indexed axes are moved to the front
    (``permute_dims``), indexed together (``index_tensor``), and moved back."""
    data = importer.env[node.args[0]]
    indices = list(node.args[1])
    indexed = [axis for axis, index in enumerate(indices) if index is not None]
    if len(indexed) < 2 or indexed == list(range(len(indexed))):
        return _default_converter(importer, "index.Tensor")(node)  # right for these
    bb, ndim = importer.block_builder, len(data.ty.shape)
    rest = [axis for axis in range(ndim) if axis not in indexed]
    moved = bb.emit(relax.op.permute_dims(data, indexed + rest))
    result = bb.emit(relax.op.index_tensor(moved, [importer.env[indices[a]] for a in indexed]))
    if indexed != list(range(indexed[0], indexed[-1] + 1)):
        return result  # indexed axes apart: their dimensions lead, as PyTorch puts them
    broadcast = len(result.ty.shape) - len(rest)
    before = indexed[0]  # the axes left of the first indexed one stay in front of its dimensions
    order = [broadcast + i for i in range(before)] + list(range(broadcast)) \
        + [broadcast + i for i in range(before, len(rest))]
    return bb.emit(relax.op.permute_dims(result, order))


def _div_mode(node, importer):
    """``aten.div.Tensor_mode(a, b, rounding_mode)`` in the dtype PyTorch computes it in: TVM's
    importer makes a Python number operand an int32 or float32 constant whatever the tensor's
    dtype ("Binary operators must have the same datatype": Llama 4's int64 positions floor-
    divided by 8192, Mask2Former's float32 sizes by 2)."""
    dtype = str(node.meta["val"].dtype).removeprefix("torch.")
    bb = importer.block_builder

    def operand(arg):
        if not isinstance(arg, torch.fx.Node):
            return relax.const(arg, dtype)
        value = importer.env[arg]
        return value if str(value.ty.dtype) == dtype else bb.emit(relax.op.astype(value, dtype))

    a, b = operand(node.args[0]), operand(node.args[1])
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("rounding_mode")
    if mode == "floor":
        return bb.emit(relax.op.floor_divide(a, b))
    quotient = bb.emit(relax.op.divide(a, b))  # an integer divide truncates already
    return bb.emit(relax.op.trunc(quotient)) if mode == "trunc" and "float" in dtype \
        else quotient


def _grid_sampler_2d(node, importer):
    """``aten.grid_sampler_2d(data, grid, mode, padding, align_corners)`` with PyTorch's grid
    ``[N, H_out, W_out, 2]`` moved to the ``[N, 2, H_out, W_out]`` TVM's ``grid_sample`` reads:
    TVM's importer passed it as it was, and the output took ``W_out`` for its height and 2 for
    its width (Mask2Former's deformable attention failed to import)."""
    data, grid = importer.env[node.args[0]], importer.env[node.args[1]]
    mode, padding, corners = (list(node.args[2:5]) + [0, 0, False][len(node.args) - 2:])[:3]
    bb = importer.block_builder
    grid = bb.emit(relax.op.permute_dims(grid, [0, 3, 1, 2]))
    return bb.emit(relax.op.image.grid_sample(
        data, grid, method={0: "bilinear", 1: "nearest", 2: "bicubic"}[mode], layout="NCHW",
        padding_mode={0: "zeros", 1: "border", 2: "reflection"}[padding],
        align_corners=bool(corners)))


def _index_put(name: str):
    """``aten.index_put(x, [mask], value)`` with one boolean mask and one value (``x[mask] = 0``:
    Granite Speech blanks its audio tokens so) as ``where(mask, value, x)``; TVM's importer
    takes integer indices only ("IndexPut requires each index tensor to have integer dtype").
    Other index_puts are the importer's own."""

    def convert(node, importer):
        indices, value = node.args[1], node.args[2]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        mask = indices[0] if len(indices) == 1 else None
        if accumulate or mask is None or mask.meta["val"].dtype != torch.bool \
                or not isinstance(value, torch.fx.Node) or value.meta["val"].numel() != 1:
            return _default_converter(importer, name)(node)
        bb, x = importer.block_builder, importer.env[node.args[0]]
        mask = importer.env[mask]
        for _ in range(len(x.ty.shape) - len(mask.ty.shape)):  # a mask of the leading axes
            mask = bb.emit(relax.op.expand_dims(mask, -1))
        fill = bb.emit(relax.op.astype(relax.op.reshape(importer.env[value], []), x.ty.dtype))
        return bb.emit(relax.op.where(mask, fill, x))

    return convert


def _masked_scatter(node, importer):
    """``aten.masked_scatter(x, mask, source)``: the masked positions of ``x``, in row-major
    order, take ``source``'s elements in order (Higgs Audio places its audio embeddings among
    the text's so). The k-th masked position takes source element k, k the running count of
    the mask: a cumsum and a gather, of static shape."""
    bb = importer.block_builder
    x, mask, source = (importer.env[a] for a in node.args[:3])
    shape = [int(d) for d in x.ty.shape]
    mask = bb.emit(relax.op.broadcast_to(mask, shape))
    mask = bb.emit(relax.op.reshape(mask, [-1]))
    count = bb.emit(relax.op.cumsum(bb.emit(relax.op.astype(mask, "int64")), axis=0,
                                    dtype="int64"))
    index = bb.emit(relax.op.maximum(bb.emit(relax.op.subtract(count, relax.const(1, "int64"))),
                                     relax.const(0, "int64")))
    taken = bb.emit(relax.op.take(bb.emit(relax.op.reshape(source, [-1])), index, axis=0))
    flat = bb.emit(relax.op.where(mask, taken, bb.emit(relax.op.reshape(x, [-1]))))
    return bb.emit(relax.op.reshape(flat, shape))


class Complex(NamedTuple):
    """A complex tensor as its real and imaginary parts (``imag`` None: zero)."""

    real: relax.Expr
    imag: relax.Expr | None


#: The real dtype of each complex one.
_PARTS = {torch.complex64: "float32", torch.complex128: "float64"}


def _to_copy(node, importer):
    """``aten._to_copy``: a cast of a real tensor to a complex dtype (FNet's
    ``torch.fft.fftn(x)``) becomes a :class:`Complex` with no imaginary part; the rest is the
    importer's own."""
    dtype = node.kwargs.get("dtype")
    if dtype not in _PARTS:
        return _default_converter(importer, "_to_copy.default")(node)
    x = importer.env[node.args[0]]
    if isinstance(x, Complex):
        return x
    real = x if str(x.ty.dtype) == _PARTS[dtype] else importer.block_builder.emit(
        relax.op.astype(x, _PARTS[dtype]))
    return Complex(real, None)


def _fft_c2c(node, importer):
    """``aten._fft_c2c(z, dims, normalization, forward)`` as a discrete Fourier transform along
    each dim in turn: a matrix product with the cosine and sine tables of that dim's length
    (n^2 multiply-adds a row where an FFT takes n log n: for the sequence and hidden lengths of
    the encoders that use it, a GEMM our schedules run well). ``normalization`` as ATen numbers
    it: 0 none, 1 by 1/sqrt(n), 2 by 1/n."""
    z = importer.env[node.args[0]]
    if not isinstance(z, Complex):
        raise TypeError("_fft_c2c of a tensor tvmfuse did not see made complex")
    return _dft(importer.block_builder, z, node.args[1], node.args[2], node.args[3])


def _fft_r2c(node, importer):
    """``aten._fft_r2c(x, dims, normalization, onesided)``: the forward transform of a real
    tensor; ``onesided`` keeps the first n//2 + 1 entries of the last dim (the rest mirror
    them)."""
    x = importer.env[node.args[0]]
    dims, normalization, onesided = node.args[1], node.args[2], node.args[3]
    bb = importer.block_builder
    real, imag = _dft(bb, Complex(x, None), dims, normalization, True)
    if onesided:
        last, keep = dims[-1], int(x.ty.shape[dims[-1]]) // 2 + 1
        real, imag = (bb.emit(relax.op.strided_slice(part, [last], [0], [keep]))
                      for part in (real, imag))
    return Complex(real, imag)


def dft_tables(n: int, scale: float, forward: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)``: the real and imaginary parts of the DFT matrix of length ``n``,
    ``scale * e^(-+ 2 pi i j k / n)`` (minus: ``forward``), symmetric, so that ``x @ table``
    transforms ``x``'s last axis. The ONNX DFT's rewrite (tvmfuse.frontend) shares them."""
    angle = 2 * np.pi * np.outer(np.arange(n), np.arange(n)) / n
    return np.cos(angle) * scale, np.sin(angle) * scale * (-1 if forward else 1)


def _dft(bb, z: Complex, dims, normalization: int, forward: bool) -> Complex:
    real, imag = z
    rank, dtype = len(real.ty.shape), str(real.ty.dtype)
    for dim in dims:
        n = int(real.ty.shape[dim])
        scale = {0: 1.0, 1: 1 / math.sqrt(n), 2: 1 / n}[normalization]
        cos, sin = (relax.const(table.astype(dtype)) for table in dft_tables(n, scale, forward))
        # (re + i im)(cos + i sin) along ``dim``: re cos - im sin, re sin + im cos
        along = _AlongAxis(bb, dim % rank, rank)
        new_real, new_imag = along.matmul(real, cos), along.matmul(real, sin)
        if imag is not None:
            new_real = bb.emit(relax.op.subtract(new_real, along.matmul(imag, sin)))
            new_imag = bb.emit(relax.op.add(new_imag, along.matmul(imag, cos)))
        real, imag = new_real, new_imag
    return Complex(real, imag)


class _AlongAxis:
    """``x @ table`` applied along one axis of a tensor (moved last and back)."""

    def __init__(self, bb, axis: int, rank: int):
        self.bb, self.axis, self.rank = bb, axis, rank
        self.order = [a for a in range(rank) if a != axis] + [axis]

    def matmul(self, x, table):
        if self.axis == self.rank - 1:
            return self.bb.emit(relax.op.matmul(x, table))
        moved = self.bb.emit(relax.op.permute_dims(x, self.order))
        product = self.bb.emit(relax.op.matmul(moved, table))
        back = sorted(range(self.rank), key=self.order.__getitem__)
        return self.bb.emit(relax.op.permute_dims(product, back))


def _view_as_real(node, importer):
    """``aten.view_as_real``: the parts stacked on a last axis of 2."""
    z = importer.env[node.args[0]]
    if not isinstance(z, Complex):
        raise TypeError("view_as_real of a tensor tvmfuse did not see made complex")
    bb = importer.block_builder
    imag = z.imag if z.imag is not None else bb.emit(relax.op.zeros_like(z.real))
    return bb.emit(relax.op.stack([z.real, imag], axis=-1))


def _view_as_complex(node, importer):
    """``aten.view_as_complex``: a last axis of 2 as the real and imaginary parts."""
    x = importer.env[node.args[0]]
    bb = importer.block_builder
    return Complex(*(bb.emit(relax.op.squeeze(relax.op.strided_slice(x, [-1], [i], [i + 1]),
                                              [-1])) for i in (0, 1)))


def _polar(node, importer):
    """``aten.polar(abs, angle)``: ``abs * cos(angle) + i abs * sin(angle)`` (DeepSeek-V2's
    rotary frequencies)."""
    magnitude, angle = (importer.env[a] for a in node.args[:2])
    bb = importer.block_builder
    return Complex(bb.emit(relax.op.multiply(magnitude, relax.op.cos(angle))),
                   bb.emit(relax.op.multiply(magnitude, relax.op.sin(angle))))


def _default_converter(importer, name: str):
    """The importer's own converter of ``name``, which CONVERTERS' entry replaced."""
    defaults = importer.__dict__.get("_tvmfuse_defaults")
    if defaults is None:
        defaults = importer.__dict__["_tvmfuse_defaults"] = importer.create_convert_map()
    return defaults[name]


def _complex_args(node, importer) -> list:
    return [arg for arg in node.args if isinstance(arg, torch.fx.Node)
            and isinstance(importer.env.get(arg), Complex)]


def _per_part(name: str):
    """A converter of the op ``name`` that, given a complex tensor, applies the importer's own
    conversion to its real and its imaginary part (a view, a reshape, a slice: what moves
    elements without combining them)."""

    def convert(node, importer):
        original = _default_converter(importer, name)
        complex_args = _complex_args(node, importer)
        if not complex_args:
            return original(node)
        saved = {arg: importer.env[arg] for arg in complex_args}
        parts = []
        try:
            for which in ("real", "imag"):
                if which == "imag" and all(z.imag is None for z in saved.values()):
                    parts.append(None)
                    continue
                for arg, z in saved.items():
                    importer.env[arg] = getattr(z, which) if getattr(z, which) is not None \
                        else importer.block_builder.emit(relax.op.zeros_like(z.real))
                parts.append(original(node))
        finally:
            importer.env.update(saved)
        return Complex(*parts)

    return convert


def _mul(node, importer):
    """``aten.mul.Tensor``, complex where an operand is: ``(a + ib)(c + id) = (ac - bd) +
    i(ad + bc)``; the importer's own otherwise."""
    if not _complex_args(node, importer):
        return _default_converter(importer, "mul.Tensor")(node)
    bb = importer.block_builder

    def parts(arg):
        value = importer.env[arg] if isinstance(arg, torch.fx.Node) \
            else relax.const(float(arg), "float32")
        return value if isinstance(value, Complex) else Complex(value, None)

    (a, b), (c, d) = parts(node.args[0]), parts(node.args[1])

    def product(x, y):
        return None if x is None or y is None else bb.emit(relax.op.multiply(x, y))

    def combine(x, y, op):  # op(x, y), a None operand being zero
        if y is None:
            return x
        if x is None:
            return y if op is relax.op.add else bb.emit(relax.op.negative(y))
        return bb.emit(op(x, y))

    return Complex(combine(product(a, c), product(b, d), relax.op.subtract),
                   combine(product(a, d), product(b, c), relax.op.add))


def _scatter_reduce(node, importer):
    """``aten.scatter_reduce.two(x, dim, index, src, reduce, include_self=True)`` as Relax's
    ``scatter_elements`` with a reduction (TAPAS's segment sums, means and maxima). Without
    ``include_self`` the indexed positions are first set to the reduction's identity; a mean is
    a sum divided by a count, since Relax's ``mean`` reduction averages pairwise."""
    bb = importer.block_builder
    x, dim, index, src = (importer.env[node.args[0]], node.args[1], importer.env[node.args[2]],
                          importer.env[node.args[3]])
    reduce = node.args[4] if len(node.args) > 4 else node.kwargs["reduce"]
    include_self = node.args[5] if len(node.args) > 5 else node.kwargs.get("include_self", True)
    dim %= len(x.ty.shape)
    if list(src.ty.shape) != list(index.ty.shape):  # PyTorch reads src over index's extent
        src = bb.emit(relax.op.strided_slice(src, list(range(len(index.ty.shape))),
                                             [0] * len(index.ty.shape), list(index.ty.shape)))
    dtype = str(x.ty.dtype)

    def scatter(data, updates, reduction):
        return bb.emit(relax.op.scatter_elements(data, index, updates, dim, reduction))

    def filled(value):
        return bb.emit(relax.op.full_like(src, relax.const(value, dtype)))

    if reduce == "mean":
        count = scatter(bb.emit(relax.op.zeros_like(x)), filled(1), "add")
        base = x if include_self else scatter(x, filled(0), "update")
        total = scatter(base, src, "add")
        if include_self:
            return bb.emit(relax.op.divide(total, relax.op.add(count, relax.const(1, dtype))))
        mean = relax.op.divide(total, relax.op.maximum(count, relax.const(1, dtype)))
        return bb.emit(relax.op.where(relax.op.greater(count, relax.const(0, dtype)), mean, x))
    reduction, identity = {"sum": ("add", 0), "prod": ("mul", 1), "amax": ("max", -math.inf),
                           "amin": ("min", math.inf)}[reduce]
    if "int" in dtype and math.isinf(identity):
        info = np.iinfo(dtype)
        identity = info.min if identity < 0 else info.max
    base = x if include_self else scatter(x, filled(identity), "update")
    return scatter(base, src, reduction)


def _unfold(node, importer):
    """``aten.unfold(x, dim, size, step)`` (``Tensor.unfold``: the windows of ``size`` every
    ``step`` along ``dim``, a new last axis of ``size``; UnivNet's location-variable convs) as a
    gather of the windows' constant positions along ``dim``, the window axis then moved last."""
    bb = importer.block_builder
    x, dim, size, step = importer.env[node.args[0]], *node.args[1:4]
    ndim = len(x.ty.shape)
    dim %= ndim
    windows = (int(x.ty.shape[dim]) - size) // step + 1
    positions = np.arange(windows)[:, None] * step + np.arange(size)[None, :]
    gathered = bb.emit(relax.op.take(x, relax.const(positions.astype("int64")), axis=dim))
    order = [*range(dim + 1), *range(dim + 2, ndim + 1), dim + 1]
    return bb.emit(relax.op.permute_dims(gathered, order))


#: The ops that move a complex tensor's elements without combining them (see _per_part).
_STRUCTURAL = ("unsqueeze.default", "view.default", "reshape.default", "slice.Tensor",
               "expand.default", "permute.default", "transpose.int", "clone.default",
               "select.int", "squeeze.dim", "_assert_tensor_metadata.default")

CONVERTERS = {"amax.default": _reduction(relax.op.max), "amin.default": _reduction(relax.op.min),
              "index.Tensor": _index, "div.Tensor_mode": _div_mode,
              "grid_sampler_2d.default": _grid_sampler_2d,
              "masked_scatter.default": _masked_scatter,
              "index_put.default": _index_put("index_put.default"),
              "index_put_.default": _index_put("index_put_.default"),
              "_to_copy.default": _to_copy,
              "_fft_c2c.default": _fft_c2c, "_fft_r2c.default": _fft_r2c,
              "view_as_real.default": _view_as_real, "view_as_complex.default": _view_as_complex,
              "polar.default": _polar, "mul.Tensor": _mul,
              "scatter_reduce.two": _scatter_reduce, "unfold.default": _unfold,
              **{name: _per_part(name) for name in _STRUCTURAL}}
