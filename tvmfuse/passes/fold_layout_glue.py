"""FoldLayoutGlue: transposes and reshapes that move no data become reshapes, chains of reshapes
one reshape (none where it keeps the shape), two transposes one (none where they undo each
other), and a reshape that only drops a reduction's kept unit axes the reduction itself.

After the NHWC layout, ResNet's head is ``mean(x, [1, 2], keepdims) -> permute_dims(NHWC -> NCHW)
-> reshape([1, 2048])``: the transpose moves only unit axes of a ``[1, 1, 1, 2048]`` tensor, yet
it was a copy kernel of its own. Here it becomes ``mean(x, [1, 2])`` writing ``[1, 2048]``.
A model that takes NHWC and permutes it to NCHW for its first conv met the layout change's
NCHW -> NHWC permute right after: two copies (a 28x28x144 depthwise conv's module: a 136 us
transpose kernel and the permute read inside the conv, for a 2 MFLOP conv) that are nothing.

Preconditions: static shapes (others are left alone); after the layout passes, before the fusion
patterns.
"""

from __future__ import annotations

import functools
import operator

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

