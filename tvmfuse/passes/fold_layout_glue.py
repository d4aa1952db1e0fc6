"""FoldLayoutGlue: transposes and reshapes that move no data become reshapes, chains of reshapes
one reshape (none where it keeps the shape), two transposes one (none where they undo each
other), and a reshape that only drops a reduction's kept unit axes the reduction itself.

After the NHWC layout, ResNet's head is ``mean(x, [1, 2], keepdims) -> permute_dims(NHWC -> NCHW)
-> reshape([1, 2048])``: the transpose moves only unit axes of a ``[1, 1, 1, 2048]`` tensor, yet
it was a copy kernel of its own. Here it becomes ``mean(x, [1, 2])`` writing ``[1, 2048]``.
A model that takes NHWC and permutes it to NCHW for its first conv met the layout change's
NCHW -> NHWC permute right after: two copies (a 28x28x144 depthwise conv's module: a 136 us
transpose kernel and the permute read inside the conv, for a 2 MFLOP conv) that are nothing.

The NHWC permute a conv's layout change puts before it is moved up through the ops that take any
layout, a concatenation and a resize (which then resizes in NHWC), to where it meets the glue that
made the NCHW tensor: a transformer's ``[1, H*W, C]`` tokens transposed and reshaped to
``[1, C, H, W]`` and permuted back are the same bytes, a reshape. SegFormer's decode head
upsampled its four ``[1, H*W, 256]`` maps in NCHW, concatenated them and read the result through
the permute inside its 1x1 conv (channels 64 KiB apart: 84 GFLOP/s where the same conv reads
NHWC at 200); its Mix-FFN's depthwise convs each read and wrote through two transposes
(``tvmfuse inspect segformer --profile``).

Preconditions: static shapes (others are left alone); after the layout passes, before the fusion
patterns.
"""

from __future__ import annotations

import functools
import operator

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ._rewrite import rewrite_functions, static_shape, uses_of_values

#: Reductions that take ``axis`` and ``keepdims``: operator name -> its constructor.
_REDUCTIONS = {"relax.mean": relax.op.mean, "relax.sum": relax.op.sum,
               "relax.max": relax.op.max, "relax.min": relax.op.min}


@tvm.transform.module_pass(opt_level=0, name="FoldLayoutGlue")
class FoldLayoutGlue:
    """Fold layout no-ops into reshapes and reductions; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        # the NHWC permute moved up through a concatenation, then through each part's resize
        for op, hoist in ((_CONCAT, _through_concat), (_RESIZE, _through_resize)):
            mod = rewrite_functions(mod, is_op("relax.permute_dims")(op),
                                    functools.partial(hoist, uses=uses_of_values(mod)))
        mod = rewrite_functions(mod, is_op("relax.permute_dims")(_GLUED), _glue_as_reshape)
        mod = rewrite_functions(mod, is_op("relax.permute_dims")(_FIRST), _composed_transpose)
        mod = rewrite_functions(mod, is_op("relax.permute_dims")(wildcard()), _unit_transpose)
        inner = is_op("relax.reshape")(wildcard(), wildcard())
        mod = rewrite_functions(mod, is_op("relax.reshape")(inner, wildcard()),
                                lambda expr, m: relax.op.reshape(m[inner].args[0], expr.args[1]))
        mod = rewrite_functions(mod, is_op("relax.reshape")(wildcard(), wildcard()), _same_shape)
        reduction = functools.reduce(operator.or_,
                                     (is_op(name)(wildcard()) for name in _REDUCTIONS))
        uses = uses_of_values(mod)
        pattern = is_op("relax.reshape")(reduction, wildcard())

        def squeeze(expr: relax.Expr, matches) -> relax.Expr:
            reduced = matches[reduction]
            attrs = reduced.attrs
            if not attrs.keepdims or attrs.axis is None or uses.get(reduced, 0) != 1:
                return expr
            kept = static_shape(reduced.ty.shape)
            if kept is None:
                return expr
            axes = {int(a) % len(kept) for a in attrs.axis}
            if static_shape(expr.ty.shape) != [d for i, d in enumerate(kept) if i not in axes]:
                return expr
            return _REDUCTIONS[reduced.op.name](reduced.args[0], attrs.axis, keepdims=False)

        return rewrite_functions(mod, pattern, squeeze)


def _axes(transpose: relax.Call) -> list[int] | None:
    """The permutation ``permute_dims`` applies (without ``axes``: the axes reversed), or None
    where its input's rank is unknown."""
    if transpose.attrs.axes is not None:
        return [int(a) for a in transpose.attrs.axes]
    ndim = getattr(transpose.args[0].ty, "ndim", -1)
    return list(range(ndim))[::-1] if ndim >= 0 else None


#: The first of two transposes in a row.
_FIRST = is_op("relax.permute_dims")(wildcard())


def _composed_transpose(expr: relax.Expr, matches) -> relax.Expr:
    """``permute_dims(permute_dims(x, a), b)`` as ``permute_dims(x, a[b])``, or ``x`` itself
    where the two undo each other."""
    inner = matches[_FIRST]
    first, second = _axes(inner), _axes(expr)
    if first is None or second is None:
        return expr
    axes = [first[i] for i in second]
    if axes == sorted(axes):
        return inner.args[0]
    return relax.op.permute_dims(inner.args[0], axes)


def _same_shape(expr: relax.Expr, _matches) -> relax.Expr:
    """A reshape to the shape its input already has is its input (an NHWC depthwise module kept
    one, a kernel launch of its own, once its two transposes had folded away)."""
    shape = static_shape(expr.ty.shape) if hasattr(expr.ty, "shape") else None
    source = expr.args[0]
    if shape is None or not hasattr(source.ty, "shape") or static_shape(source.ty.shape) != shape:
        return expr
    return source


def _unit_transpose(expr: relax.Expr, _matches) -> relax.Expr:
    """``permute_dims`` as a reshape when the axes it moves have size 1 (the others keep their
    order, so no element moves)."""
    shape = static_shape(expr.args[0].ty.shape)
    if shape is None:
        return expr
    axes = _axes(expr)
    moved = [a for a in axes if shape[a] != 1]
    if moved != sorted(moved):
        return expr
    return relax.op.reshape(expr.args[0], [shape[a] for a in axes])


#: A concatenation, a resize, and a reshape of a transpose: what a permute is moved through or
#: folded with.
_PARTS = wildcard()
_CONCAT = is_op("relax.concat")(_PARTS)
_RESIZE = is_op("relax.image.resize2d")(wildcard(), wildcard())
_GLUED = is_op("relax.reshape")(_FIRST, wildcard())


def _through_concat(expr: relax.Expr, matches, uses) -> relax.Expr:
    """``permute_dims(concat(xs, axis), p)`` as ``concat(permute_dims(x, p) for x in xs,
    p.index(axis))``, where the concatenation has no other use."""
    concat, parts = matches[_CONCAT], matches[_PARTS]
    axes = _axes(expr)
    if axes is None or uses.get(concat, 0) != 1 or not isinstance(parts, relax.Tuple):
        return expr
    axis = int(concat.attrs.axis) % len(axes)
    return relax.op.concat([relax.op.permute_dims(x, axes) for x in parts.fields],
                           axis=axes.index(axis))


def _through_resize(expr: relax.Expr, matches, uses) -> relax.Expr:
    """``permute_dims(resize2d(x, layout=L), p)`` as ``resize2d(permute_dims(x, p), layout=L[p])``
    where that layout is NHWC or NCHW (those TVM lowers) and the resize has no other use."""
    resize = matches[_RESIZE]
    axes, a = _axes(expr), resize.attrs
    if axes is None or len(axes) != 4 or uses.get(resize, 0) != 1:
        return expr
    layout = "".join(a.layout[i] for i in axes)
    if layout not in ("NHWC", "NCHW"):
        return expr
    return relax.op.image.resize2d(
        relax.op.permute_dims(resize.args[0], axes), resize.args[1],
        roi=[float(r) for r in a.roi], layout=layout, method=a.method,
        coordinate_transformation_mode=a.coordinate_transformation_mode,
        rounding_method=a.rounding_method, cubic_alpha=float(a.cubic_alpha),
        cubic_exclude=int(a.cubic_exclude), extrapolation_value=float(a.extrapolation_value),
        out_dtype=a.out_dtype or None)


#: The most elements :func:`_glue_as_reshape` follows through its transposes.
_GLUE_ELEMENTS = 1 << 24


def _glue_as_reshape(expr: relax.Expr, matches) -> relax.Expr:
    """``permute_dims(reshape(permute_dims(x, a), s), b)`` as ``reshape(x, ...)`` where the three
    leave every element in its place in memory order (a ``[1, H*W, C]`` map transposed to
    channels first, reshaped to ``[1, C, H, W]`` and permuted to NHWC is ``[1, H, W, C]``):
    checked by following each element's index through them."""
    reshape, first = matches[_GLUED], matches[_FIRST]
    source = static_shape(first.args[0].ty.shape)
    middle = static_shape(reshape.ty.shape)
    inner, outer = _axes(first), _axes(expr)
    if None in (source, middle, inner, outer) or np.prod(source) > _GLUE_ELEMENTS:
        return expr
    index = np.arange(np.prod(source), dtype=np.int32).reshape(source)
    moved = index.transpose(inner).reshape(middle).transpose(outer)
    if not np.array_equal(moved.ravel(), index.ravel()):
        return expr
    return relax.op.reshape(first.args[0], list(moved.shape))
