"""Shared plumbing of the rewrite passes: apply a dpl rewrite to every non-primitive function,
and the small questions they ask of Relax expressions."""

from __future__ import annotations

from collections import Counter

import tvm
from tvm import relax, sym
from tvm.relax.dpl import rewrite_call


def rewrite_functions(mod: tvm.IRModule, pattern, rewrite) -> tvm.IRModule:
    """``rewrite_call(pattern, rewrite, f)`` on each Relax function of ``mod`` that is not a
    fused kernel, then drop the bindings the rewrite left unused."""
    updated = mod.clone()
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function) and not func.attrs.get("Primitive", False):
            rewritten = tvm.IRModule({"main": rewrite_call(pattern, rewrite, func)})
            updated[gvar] = relax.transform.DeadCodeElimination()(rewritten)["main"]
    return updated


def mutate_functions(mod: tvm.IRModule, rewriter: relax.PyExprMutator) -> tvm.IRModule:
    """``rewriter`` (a mutator made over ``mod``) applied to each Relax function of ``mod`` that
    is not a fused kernel, then the bindings it left unused dropped."""
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function) and not func.attrs.get("Primitive", False):
            rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
    return relax.transform.DeadCodeElimination()(rewriter.builder_.get())


#: The narrow float types of fp16 and bf16 builds (their matmuls and convs sum in float32).
NARROW_FLOATS = ("float16", "bfloat16")


def _matmul(call: relax.Call, dtype: str) -> relax.Expr:
    return relax.op.matmul(*call.args, out_dtype=dtype)


def _conv2d(call: relax.Call, dtype: str) -> relax.Expr:
    a = call.attrs
    return relax.op.nn.conv2d(*call.args, strides=a.strides, padding=a.padding,
                              dilation=a.dilation, groups=a.groups, data_layout=a.data_layout,
                              kernel_layout=a.kernel_layout, out_layout=a.out_layout,
                              out_dtype=dtype)


#: The ops that sum products, each with how to write a call of it again with another
#: ``out_dtype`` (its sums' type): what the float32 accumulation of narrow builds rewrites.
WITH_OUT_DTYPE = {"relax.matmul": _matmul, "relax.nn.conv2d": _conv2d}


def calls_op(expr, *names: str) -> bool:
    """``expr`` is a call of the Relax operator ``name`` (e.g. ``relax.matmul``), or of one of
    ``names``."""
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and \
        expr.op.name in names


def constant_arguments(mod: tvm.IRModule) -> dict[str, set[int]]:
    """Kernel name -> the indices of the arguments that are Relax constants in every
    ``call_tir`` of it (kernels never called are absent)."""
    constant: dict[str, set[int]] = {}

    def visit(expr):
        if not calls_op(expr, "relax.call_tir"):
            return
        kernel, args = expr.args[0].name_hint, expr.args[1].fields
        here = {i for i, arg in enumerate(args) if isinstance(arg, tvm.ir.expr.Constant)}
        constant[kernel] = constant.get(kernel, here) & here

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return constant


def scalar_constant(expr) -> float | None:
    """The value of a one-element Relax constant, else None."""
    if isinstance(expr, tvm.ir.expr.GenericConst) and expr.value.numpy().size == 1:
        return float(expr.value.numpy().reshape(()))
    return None


def dims_of(expr) -> list | None:
    """The dimensions of ``expr``'s shape: ints where known, symbolic ``PrimExpr`` s (a dynamic
    batch or sequence) where not; None where it has no shape."""
    values = getattr(getattr(getattr(expr, "ty", None), "shape", None), "values", None)
    if values is None:
        return None
    return [int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in values]


_ANALYZER = sym.Analyzer()


def dims_equal(a, b) -> bool:
    """Two dimensions (ints or symbolic) are provably equal."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return bool(_ANALYZER.can_prove_equal(a, b))


def shapes_equal(a: list | None, b: list | None) -> bool:
    """Two shapes (from :func:`dims_of`) are provably equal."""
    return a is not None and b is not None and len(a) == len(b) and all(
        dims_equal(x, y) for x, y in zip(a, b))


def static_shape(shape) -> list[int] | None:
    """The dimensions of a Relax shape when all are known integers, else None."""
    values = getattr(shape, "values", None)
    if values is None or not all(isinstance(d, tvm.tirx.IntImm) for d in values):
        return None
    return [int(d) for d in values]


def dtype_of(expr: relax.Expr) -> str | None:
    """The element type of a tensor-typed ``expr`` (None for others)."""
    ty = getattr(expr, "ty", None)
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


def with_fields(attrs, changes: dict):
    """A copy of the op attributes ``attrs`` with ``changes`` to some of its fields."""
    info = type(attrs).__tvm_ffi_type_info__
    values = {field.name: getattr(attrs, field.name) for field in info.fields}
    return tvm.ir.make_node(info.type_key, **{**values, **changes})


def var_uses(func: relax.Function) -> Counter:
    """Variable -> how many of ``func``'s bindings (and its result) read it."""
    counts = Counter()
    for block in func.body.blocks:
        for binding in block.bindings:
            counts.update(relax.analysis.free_vars(binding.value))
    counts.update(relax.analysis.free_vars(func.body.body))
    return counts


def uses_of_values(mod: tvm.IRModule) -> Counter:
    """Bound value (a call) -> how many times the variable bound to it is used, in the Relax
    functions of ``mod``: what a rewrite asks before it hides an intermediate in a new expression
    (``rewrite_call`` would keep the old binding alive for its other users and compute it twice)."""
    uses = Counter()
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        counts = var_uses(func)
        for block in func.body.blocks:
            for binding in block.bindings:
                uses[binding.value] = counts[binding.var]
    return uses
