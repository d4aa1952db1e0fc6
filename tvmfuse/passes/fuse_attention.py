"""FuseAttention: multi-head attention, from the head split to the head merge, as one kernel.

torch.export gives attention as some thirty Relax bindings per layer: each of Q, K and V is
``reshape([B, S, H, D]) -> permute_dims([0, 2, 1, 3])`` of a ``[B, S, H * D]`` projection (K then
transposed once more), the scores ``matmul`` between ``broadcast_to``/``reshape`` pairs (the
batched-matmul decomposition), ``multiply`` (or ``divide``) by the scale, ``add`` of the mask,
``softmax`` on the last axis, the second ``matmul``, and ``permute_dims([0, 2, 1, 3]) ->
reshape([B, S, H * D])`` merging the heads. Pattern fusion can put the scale, mask and softmax in
one kernel, but the head split and merge stay copies and the scores a round trip through memory.

This pass follows that chain from each ``softmax`` back to Q, K and V and forward to the merged
output, and binds the output to one ``call_tir`` of a kernel the target provides (``kernel``, e.g.
:func:`tvmfuse.schedules.cpu.attention.attention_kernel`) that reads Q, K and V where they are:
when they are ``strided_slice`` s of one packed QKV GEMM (as MergeParallelMatmul leaves them), the
kernel reads the packed tensor at each one's channel offset, so the slices disappear too. What the
chain computed and nothing used any more is removed; anything else that uses an intermediate keeps
it.

A chain that differs anywhere (a softmax not on the last axis, a scale that is not a scalar
constant, heads not split as above, a mask that does not broadcast per dimension) is left as it
is.

Preconditions: after MergeParallelMatmul, before the fusion patterns and LegalizeOps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from .. import names
from ..shapes import AttentionShape
from ._rewrite import (
    NARROW_FLOATS,
    calls_op,
    dims_equal,
    dims_of,
    scalar_constant,
    shapes_equal,
)

#: The fusion rule this pass implements, as the build report names it.
RULE = "tvmfuse.fused_attention"


@dataclass(frozen=True)
class _Operand:
    """Heads of Q, K or V: read from ``tensor`` ([B, S, C]) starting at channel ``offset``; or,
    with ``heads_first``, ``tensor`` is already ``[B, H, S, D]`` (rotary embeddings applied to
    the heads, grouped-query K and V repeated per head) and the kernel's call merges it to
    ``[B, S, H * D]`` first (a copy, which FuseOps joins to the kernel that computes it)."""

    tensor: relax.Expr
    offset: int
    heads_first: bool = False


@dataclass(frozen=True)
class _Match:
    shape: AttentionShape
    q: _Operand
    k: _Operand
    v: _Operand
    mask: relax.Expr | None

    @property
    def ops(self) -> list[str]:
        """The ops the kernel replaces, as the report lists a group's (views left out)."""
        packed = any(o.offset for o in (self.q, self.k, self.v))
        return [*(["strided_slice"] if packed else []), "reshape", "permute_dims", "matmul",
                *(["multiply"] if self.shape.scale != 1.0 else []),
                *(["add"] if self.mask is not None else []),
                "softmax", "matmul", "permute_dims", "reshape"]


@tvm.transform.module_pass(opt_level=0, name="FuseAttention")
class FuseAttention:
    """Replace attention chains by one kernel call each; see the module docstring.

    Parameters
    ----------
    kernel : callable
        ``AttentionShape -> tirx.PrimFunc``: the target's scheduled attention kernel, or None
        for a shape it has no kernel for (that chain is left as it is).
    """

    def __init__(self, kernel: Callable):
        self.kernel = kernel

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        found = {gvar: _find(func) for gvar, func in mod.functions.items()
                 if isinstance(func, relax.Function) and not func.attrs.get("Primitive", False)}
        kernels = {}
        for matches in found.values():
            for var, match in list(matches.items()):
                if match.shape not in kernels:
                    kernels[match.shape] = self.kernel(match.shape)
                if kernels[match.shape] is None:  # the target has no kernel for this one
                    del matches[var]
        found = {gvar: matches for gvar, matches in found.items() if matches}
        if not found:
            return mod
        rewriter = _Rewriter(mod, kernels.__getitem__)
        for gvar, matches in found.items():
            rewriter.matches = matches
            rewriter.builder_.update_func(gvar, rewriter.visit_expr(mod[gvar]))
        return relax.transform.DeadCodeElimination()(rewriter.builder_.get())


# --- matching ----------------------------------------------------------------------------------


def _find(func: relax.Function) -> dict[relax.Var, _Match]:
    """Merged-output variable -> what computes it, for every attention chain of ``func``."""
    found = {}
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        values = {b.var: b.value for b in block.bindings}
        users = relax.analysis.udchain(block)
        for binding in block.bindings:
            if calls_op(binding.value, "relax.nn.softmax"):
                match = _match(binding, values, users)
                if match is not None:
                    found[match[0]] = match[1]
    return found


def _match(softmax: relax.VarBinding, values, users):
    probs = softmax.var
    shape = dims_of(probs)
    if shape is None or len(shape) != 4:
        return None
    batch, heads, seq, kv_seq = shape
    if not isinstance(heads, int) or int(softmax.value.attrs.axis) not in (-1, 3):
        return None
    # backwards: [add mask] <- [multiply/divide scale] <- reshape <- matmul(Q heads, K^T heads)
    scores, mask = _peel(values, softmax.value.args[0]), None
    if calls_op(scores, "relax.add"):
        scores, mask = _split_mask(scores, values, shape)
        if scores is None:
            return None
    scores, scale = _scale(values, scores)
    if scale is None:
        return None
    qk = _through_views(values, scores)
    if not calls_op(qk, "relax.matmul"):
        return None
    q = _heads(values, qk.args[0], batch, heads, seq, transposed=False)
    k = _heads(values, qk.args[1], batch, heads, kv_seq, transposed=True)
    if q is None or k is None or q[1] != k[1]:
        return None
    head_dim = q[1]
    scale *= q[2] * k[2]  # PyTorch's SDPA scales Q and K^T by sqrt(scale) each
    # forwards: probs -> [the safe softmax's zeros for rows without a key, broadcast_to,
    # reshape] -> matmul(., V heads) -> reshape -> permute(s) -> reshape [B, S, H * D]
    pv = _forward_to(probs, values, users, "relax.matmul",
                     guard=lambda where: _is_no_key_guard(values, where, softmax.value.args[0]))
    if pv is None:
        return None
    v = _heads(values, pv[1].args[1], batch, heads, kv_seq, transposed=False)
    if v is None or v[1] != head_dim or v[2] != 1.0:
        return None
    merged = _merge_heads(pv[0], values, users, (batch, seq, heads * head_dim))
    if merged is None:
        return None
    # storage: the output's; the probabilities may be float32 (fp16 builds), and so may heads
    # computed apart (rotary embeddings on float32 cos and sin: ToMixedPrecision casts them
    # to float16 only for the matmul), which the kernel's call casts as the graph did
    dtype = str(values[merged].ty.dtype)
    if any(str(t.tensor.ty.dtype) != dtype and not (
            t.heads_first and dtype in NARROW_FLOATS and str(t.tensor.ty.dtype) == "float32")
            for t in (q[0], k[0], v[0])):
        return None
    attention = AttentionShape(
        batch=batch, seq=seq, kv_seq=kv_seq, heads=heads, head_dim=head_dim,
        q=_channels(q[0], heads * head_dim), k=_channels(k[0], heads * head_dim),
        v=_channels(v[0], heads * head_dim),
        mask=tuple(dims_of(mask)) if mask is not None else (1, 1, 1, 1), scale=scale, dtype=dtype)
    return merged, _Match(attention, q[0], k[0], v[0], mask)


def _channels(operand: _Operand, merged: int) -> tuple[int, int]:
    """(channels, offset) of the ``[B, S, C]`` tensor the kernel reads ``operand`` from."""
    if operand.heads_first:
        return merged, 0
    return dims_of(operand.tensor)[2], operand.offset


def _split_mask(add: relax.Call, values, shape):
    """(scores, mask) of ``scores + mask``: the mask has rank 4 and each dimension either 1
    (broadcast) or the scores'."""
    for scores, mask in (add.args, add.args[::-1]):
        mask_shape = dims_of(mask)
        if (_is_scores(values, scores) and mask_shape is not None and len(mask_shape) == 4
                and all(dims_equal(m, 1) or dims_equal(m, s) for m, s in zip(mask_shape, shape))
                and str(mask.ty.dtype) == str(add.ty.dtype)):
            return _peel(values, scores), mask
    return None, None


def _is_scores(values, expr) -> bool:
    expr, scale = _scale(values, expr)
    return scale is not None and calls_op(_through_views(values, expr), "relax.matmul")


def _scale(values, expr):
    """(scores, scale) of ``scores * c`` or ``scores / c`` with a scalar constant ``c``; plain
    ``scores`` have scale 1; (None, None) for any other product."""
    expr = _peel(values, expr)
    multiply = calls_op(expr, "relax.multiply")
    if not (multiply or calls_op(expr, "relax.divide")):
        return expr, 1.0
    scores, constant = expr.args[0], scalar_constant(expr.args[1])
    if constant is None and multiply:
        scores, constant = expr.args[1], scalar_constant(expr.args[0])
    if constant is None or constant == 0:
        return None, None
    return _peel(values, scores), constant if multiply else 1.0 / constant


def _heads(values, expr, batch, heads, seq, transposed: bool):
    """(operand, head_dim, factor) when ``expr`` is ``factor`` (a scalar constant, 1 if none)
    times the heads of a ``[B, S, H * D]`` tensor as ``[B * H, S, D]`` or ``[B, H, S, D]`` (``D``
    and ``S`` swapped when ``transposed``), or of any ``[B, H, S, D]`` tensor."""
    expr, factor = _unscale(values, _through_views(values, expr, keep_4d=True))
    if transposed:
        if calls_op(expr, "relax.permute_dims") and _axes(expr) == [0, 2, 3, 1]:
            split = _split(values, expr.args[0], batch, seq, heads)
            return None if split is None else (*split, factor)
        if not (calls_op(expr, "relax.permute_dims") and _axes(expr) == [0, 1, 3, 2]):
            return None
        expr, more = _unscale(values, _through_views(values, expr.args[0], keep_4d=True))
        factor *= more
    if calls_op(expr, "relax.permute_dims") and _axes(expr) == [0, 2, 1, 3]:
        split = _split(values, expr.args[0], batch, seq, heads)
        if split is not None:
            return (*split, factor)
    found = dims_of(expr)
    if (found is None or len(found) != 4 or not shapes_equal(found[:3], [batch, heads, seq])
            or not isinstance(found[3], int)):
        return None
    return _Operand(expr, 0, heads_first=True), found[3], factor


def _unscale(values, expr):
    """(x, c) of ``x * c`` for a scalar constant ``c`` (repeatedly); (expr, 1.0) otherwise."""
    factor = 1.0
    while calls_op(expr, "relax.multiply"):
        for x, c in (expr.args, expr.args[::-1]):
            constant = scalar_constant(c)
            if constant is not None:
                factor *= constant
                expr = _peel(values, x)
                break
        else:
            break
    return expr, factor


def _is_no_key_guard(values, where: relax.Call, scores) -> bool:
    """``where`` is the safe softmax of PyTorch's SDPA: ``where(no_key, 0, probs)`` where
    ``no_key`` says a row's scores are all -inf, computed as ``not(max(int8(not(scores ==
    -inf)), -1, keepdims))``. The kernel gives such rows 0 as well."""
    if not _is_zeros(values, where.args[1]):
        return False
    expr, ops = _peel(values, where.args[0]), []
    while calls_op(expr, "relax.logical_not") or calls_op(expr, "relax.astype") or calls_op(
            expr, "relax.max"):
        ops.append(expr.op.name)
        if expr.op.name == "relax.max" and [int(a) for a in expr.attrs.axis] not in ([-1], [3]):
            return False
        expr = _peel(values, expr.args[0])
    if not calls_op(expr, "relax.equal") or ops.count("relax.logical_not") != 2 \
            or "relax.max" not in ops:
        return False
    bound = scalar_constant(expr.args[1])
    return bound == float("-inf") and _peel(values, expr.args[0]).same_as(_peel(values, scores))


def _is_zeros(values, expr) -> bool:
    """A constant of zeros, or ``full_like(x, 0)`` (what it is where the shape is symbolic)."""
    if isinstance(expr, tvm.ir.expr.GenericConst):
        return not np.any(expr.value.numpy())
    expr = _peel(values, expr)
    return calls_op(expr, "relax.full_like") and scalar_constant(expr.args[1]) == 0


def _split(values, expr, batch, seq, heads):
    """(operand, head_dim) of ``reshape(x, [B, S, H, D])`` with ``x`` ``[B, S, H * D]``."""
    expr = _peel(values, expr)
    if not calls_op(expr, "relax.reshape"):
        return None
    split = dims_of(expr)
    source = expr.args[0]
    flat = dims_of(source)
    if (split is None or flat is None or len(split) != 4 or not isinstance(split[3], int)
            or not shapes_equal(split[:3], [batch, seq, heads])
            or not shapes_equal(flat, [batch, seq, heads * split[3]])):
        return None
    return _operand(values, source), split[3]


def _operand(values, expr) -> _Operand:
    """Where a ``[B, S, H * D]`` operand is read from: the packed tensor and offset when it is a
    unit-stride slice of the last axis (``strided_slice(x, axes, begin, end[, strides])``), else
    itself."""
    sliced = _peel(values, expr)
    if calls_op(sliced, "relax.strided_slice"):
        source, axes, begin, end = (sliced.args[0], *map(_ints, sliced.args[1:4]))
        strides = _ints(sliced.args[4]) if len(sliced.args) > 4 else [1]
        source_shape = dims_of(source)
        if (axes == [2] and strides == [1] and source_shape is not None and len(source_shape) == 3
                and begin is not None and end is not None and 0 <= begin[0] < end[0]
                <= source_shape[2]):
            return _Operand(source, begin[0])
    return _Operand(expr, 0)


def _merge_heads(var, values, users, flat_shape):
    """The ``reshape([B, S, H * D])`` variable that merges ``var``'s ``[B * H, S, D]`` heads
    (through permutations that compose to ``[0, 2, 1, 3]``: SDPA's output takes three; none for
    a single query)."""
    step = _only_user(var, values, users)
    if (step is not None and calls_op(values[step], "relax.reshape")
            and len(dims_of(step) or ()) == 4):
        var, step = step, _only_user(step, values, users)
    order = [0, 1, 2, 3]
    while step is not None and (calls_op(values[step], "relax.permute_dims") or (
            calls_op(values[step], "relax.reshape") and shapes_equal(dims_of(step), dims_of(var)))):
        if calls_op(values[step], "relax.permute_dims"):  # (a reshape to its own shape: a view)
            order = [order[a] for a in _axes(values[step])]
        var, step = step, _only_user(step, values, users)
    # with one query the permutation moves no data, and FoldLayoutGlue has removed it
    if order != [0, 2, 1, 3] and not (dims_equal(flat_shape[1], 1) and order == [0, 1, 2, 3]):
        return None
    merged = step
    if (merged is None or not calls_op(values[merged], "relax.reshape")
            or not shapes_equal(dims_of(merged), list(flat_shape))):
        return None
    return merged


def _forward_to(var, values, users, op: str, guard=lambda where: False):
    """Follow ``var``'s single users through views (and ``where`` calls that ``guard``
    accepts, choosing between a constant and ``var``) to the first ``op`` call that takes it
    as its first argument: (its var, call)."""
    source = var  # what the views show, for the check that ``op`` reads it
    while True:
        # (``full_like(probs, 0)``, the safe softmax's zeros, uses only the shape)
        step = _only_user(var, values, users,
                          ignore=lambda user: calls_op(values[user], "relax.full_like"))
        if step is None:
            return None
        value = values[step]
        if calls_op(value, op):
            return (step, value) if _same_tensor(values, value.args[0], source) else None
        if calls_op(value, "relax.where") and value.args[2].same_as(var) and guard(value):
            var = source = step
            continue
        if not (calls_op(value, "relax.broadcast_to") or calls_op(value, "relax.reshape")
                or _is_float_cast(value)):
            return None
        var = step


def _same_tensor(values, expr, var) -> bool:
    """``expr`` is ``var`` seen through shape-preserving broadcasts and batch reshapes."""
    return _through_views(values, expr, keep_4d=True).same_as(_peel(values, var))


def _through_views(values, expr, keep_4d: bool = False):
    """Skip ``broadcast_to`` to the same shape and the batch reshapes around a batched matmul
    (``[B, H, X, Y] <-> [B * H, X, Y]``); with ``keep_4d`` stop at the first 4-D tensor."""
    expr = _peel(values, expr)
    while True:
        if calls_op(expr, "relax.broadcast_to") and shapes_equal(dims_of(expr),
                                                                 dims_of(expr.args[0])):
            expr = _peel(values, expr.args[0])
            continue
        if calls_op(expr, "relax.reshape"):
            inner, outer = dims_of(expr.args[0]), dims_of(expr)
            if (inner is not None and outer is not None and shapes_equal(inner[-2:], outer[-2:])
                    and dims_equal(math.prod(inner), math.prod(outer))
                    and {len(inner), len(outer)} == {3, 4}
                    and not (keep_4d and len(outer) == 4)):
                expr = _peel(values, expr.args[0])
                continue
        return expr


def _peel(values, expr):
    """The call bound to ``expr`` when it is a variable of this block, else ``expr``; through
    casts between float types (the float16 chain ToMixedPrecision leaves computes the softmax
    in float32: the kernel computes in float32 throughout)."""
    while True:
        while isinstance(expr, relax.Var) and expr in values:
            expr = values[expr]
        if not _is_float_cast(expr):
            return expr
        expr = expr.args[0]


def _is_float_cast(expr) -> bool:
    return (calls_op(expr, "relax.astype") and "float" in str(expr.attrs.dtype)
            and "float" in str(getattr(expr.args[0].ty, "dtype", "")))


def _only_user(var, values, users, ignore=lambda user: False):
    found = [u for u in users.get(var, []) if not (u in values and ignore(u))]
    return found[0] if len(found) == 1 and found[0] in values else None


# --- small helpers -----------------------------------------------------------------------------


def _axes(call) -> list[int] | None:
    axes = call.attrs.axes
    return None if axes is None else [int(a) for a in axes]


def _ints(expr) -> list[int] | None:
    """The integers of a Relax tuple of ``PrimValue`` s or a ``ShapeExpr``, if all are known."""
    items = getattr(expr, "fields", None) or getattr(expr, "values", None)
    if items is None:
        return None
    found = [getattr(item, "value", item) for item in items]
    if not all(isinstance(v, (int, tvm.tirx.IntImm)) for v in found):
        return None
    return [int(v) for v in found]


# --- rewriting ---------------------------------------------------------------------------------


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, kernel: Callable):
        super().__init__(mod)
        self.matches: dict[relax.Var, _Match] = {}
        self.kernel = kernel
        self.kernels: dict[AttentionShape, tvm.ir.GlobalVar] = {}
        #: (mask, dtype) -> the mask cast once for every layer that reads it (a kernel each)
        self.cast_masks: dict[tuple[relax.Expr, str], relax.Expr] = {}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        match = self.matches.get(binding.var)
        if match is None:
            super().visit_var_binding_(binding)
            return
        shape = match.shape
        gvar = self.kernels.get(shape)
        if gvar is None:
            kernel = self.kernel(shape).with_attrs(
                {names.FUSION: RULE, names.FUSION_OPS: match.ops})
            gvar = self.builder_.add_func(kernel, "attention")
            self.kernels[shape] = gvar
        mask = (self.visit_expr(match.mask) if match.mask is not None
                else relax.const(np.zeros((1, 1, 1, 1), shape.dtype)))
        if str(mask.ty.dtype) != shape.dtype:  # a float32 mask of a float16 chain
            key = (mask, shape.dtype)
            if key not in self.cast_masks:
                self.cast_masks[key] = self.builder_.emit(relax.op.astype(mask, shape.dtype))
            mask = self.cast_masks[key]
        args = [self._flat(match.q, shape, shape.seq), self._flat(match.k, shape, shape.kv_seq),
                self._flat(match.v, shape, shape.kv_seq), mask]
        out = relax.TensorType((shape.batch, shape.seq, shape.heads * shape.head_dim),
                                     shape.dtype)
        call = self.builder_.emit(relax.call_tir(gvar, args, out), "attention")
        self.set_var_remap(binding.var, call)

    def _flat(self, operand: _Operand, shape: AttentionShape, seq: int) -> relax.Expr:
        """The ``[B, seq, C]`` tensor the kernel reads ``operand`` from."""
        tensor = self.visit_expr(operand.tensor)
        if not operand.heads_first:
            return tensor
        if str(tensor.ty.dtype) != shape.dtype:  # float32 heads of a narrow chain
            tensor = self.builder_.emit(relax.op.astype(tensor, shape.dtype))
        merged = self.builder_.emit(relax.op.permute_dims(tensor, [0, 2, 1, 3]))
        return self.builder_.emit(relax.op.reshape(
            merged, (shape.batch, seq, shape.heads * shape.head_dim)))
