"""Shared plumbing of the rewrite passes: apply a dpl rewrite to every non-primitive function,
and the small questions they ask of Relax expressions."""

from __future__ import annotations

import hashlib
import math
from collections import Counter

import tvm
from tvm import relax, sym
from tvm_ffi import structural_equal


def rewrite_functions(mod: tvm.IRModule, pattern, rewrite) -> tvm.IRModule:
    """``rewrite(expr, matches)`` on every binding of each Relax function of ``mod`` (not a
    fused kernel) whose value ``pattern`` matches, round after round until a round changes
    nothing, then the bindings it left unused dropped: TVM's ``rewrite_call``, whose rounds end
    in a common-subexpression elimination that hashes every constant's bytes (over BERT-base's
    weights, four of them made one rewrite pass 1.1 s of a 25 s build; ``python
    benchmarks/build_time.py``). Here each round ends in :func:`eliminate_common_subexpressions`."""
    updated = mod.clone()
    for gvar, func in mod.functions.items():
        if not isinstance(func, relax.Function) or func.attrs.get("Primitive", False):
            continue
        keys = ConstantKeys(func)
        while True:
            rewriter = _PatternRewriter(pattern, rewrite, relax.analysis.get_var2val(func))
            rewritten = rewriter.visit_expr(func)
            if not rewriter.changed:
                break
            # as rewrite_call's rounds end: `y = x` read as x, and equal values merged
            canonical = relax.transform.CanonicalizeBindings()(tvm.IRModule({"main": rewritten}))
            merged = eliminate_common_subexpressions(canonical["main"], keys)
            if structural_equal(merged, func):  # a rewrite that rebuilt what was there
                break
            func = merged
        updated[gvar] = relax.transform.DeadCodeElimination()(
            tvm.IRModule({"main": func}))["main"]
    return updated


class ConstantKeys:
    """When two large constants are one value to :func:`eliminate_common_subexpressions`: among
    the constants ``func`` holds (its weights), when they are the same object; among those made
    after it (a rewrite's), when their bytes are equal: a BatchNorm folded into its conv where
    two bindings read the norm makes two equal weights, whose convs TVM's pass merges."""

    def __init__(self, func: relax.Function):
        collector = _Constants()
        collector.visit_expr(func)
        self.own = collector.found
        self.digests: dict[relax.Constant, tuple] = {}

    def __call__(self, const: relax.Constant):
        if const in self.own:
            return const
        if const not in self.digests:
            data = const.value.numpy()
            self.digests[const] = (str(data.dtype), data.shape,
                                   hashlib.sha1(data.tobytes()).digest())
        return self.digests[const]


def eliminate_common_subexpressions(func: relax.Function,
                                    keys: ConstantKeys | None = None) -> relax.Function:
    """TVM's ``EliminateCommonSubexpr`` over ``func`` with its constants of
    :data:`HIDDEN_CONSTANT_BYTES` or more hidden behind parameters while it runs, one for each
    value ``keys`` tells apart (default: each object): the pass hashes every constant's bytes,
    0.46 s a run for BERT-base's weights on a Zen 4."""
    hider = _HideConstants(keys or (lambda const: const))
    hidden = hider.visit_expr(func)
    widened = relax.Function([*hidden.params, *hider.params.values()], hidden.body,
                             hidden.ret_ty, hidden.is_pure, hidden.attrs)
    merged = relax.transform.EliminateCommonSubexpr()(tvm.IRModule({"main": widened}))["main"]
    return merged.bind_params({var: hider.constants[key] for key, var in hider.params.items()})


#: The size from which :func:`eliminate_common_subexpressions` hides a constant: weights, not
#: the scalars and small masks that two ops may each hold a copy of (TVM merges their reads).
HIDDEN_CONSTANT_BYTES = 4096


def _bytes(const) -> int:
    dims = dims_of(const)
    if dims is None:
        return 0
    return math.prod(dims) * tvm.runtime.DataType(const.ty.dtype).bits // 8


@relax.expr_functor.mutator
class _HideConstants(relax.PyExprMutator):
    """Each constant of :data:`HIDDEN_CONSTANT_BYTES` or more read as a variable of its type,
    one for each of ``key``'s values (``params``), holding the first such constant
    (``constants``)."""

    def __init__(self, key):
        super().__init__()
        self.key = key
        self.params: dict = {}
        self.constants: dict = {}

    def visit_generic_const_(self, const: relax.Constant) -> relax.Expr:
        if _bytes(const) < HIDDEN_CONSTANT_BYTES:
            return const
        key = self.key(const)
        if key not in self.params:
            self.params[key] = relax.Var(f"hidden_const{len(self.params)}", const.ty)
            self.constants[key] = const
        return self.params[key]


@relax.expr_functor.visitor
class _Constants(relax.PyExprVisitor):
    """The constants an expression holds (``found``)."""

    def __init__(self):
        super().__init__()
        self.found: set = set()

    def visit_generic_const_(self, const: relax.Constant) -> None:
        self.found.add(const)


@relax.expr_functor.mutator
class _PatternRewriter(relax.PyExprMutator):
    """One round of :func:`rewrite_functions`: each binding's value matched against the
    function's bindings as the round began (``var2val``), replaced where ``rewrite`` returns
    an expression that differs from it."""

    def __init__(self, pattern, rewrite, var2val):
        super().__init__()
        self.pattern, self.rewrite, self.var2val = pattern, rewrite, var2val
        self.changed = False

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        matches = None
        if not isinstance(binding.value, relax.Var):  # the matcher reads through `y = x`
            matches = self.pattern.extract_matched_expr(binding.value, self.var2val)
        if matches is not None:
            replaced = self.rewrite(binding.value, matches)
            if not replaced.same_as(binding.value) and not structural_equal(replaced,
                                                                             binding.value):
                self.changed = True
                if isinstance(replaced, relax.Call):
                    replaced = self._call(replaced)
                binding = relax.VarBinding(binding.var, replaced)
        super().visit_var_binding_(binding)

    def _call(self, call: relax.Call) -> relax.Call:
        """``call`` over arguments in Relax's normal form, each emitted depth first before the
        next, the order TVM's normalizer (and so ``rewrite_call``) gives the bindings."""
        return relax.Call(call.op, [self._operand(a) for a in call.args], call.attrs,
                          call.ty_args)

    def _operand(self, expr: relax.Expr) -> relax.Expr:
        if isinstance(expr, relax.Call):
            return self.builder_.emit(self._call(expr))
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self._operand(field) for field in expr.fields])
        if isinstance(expr, relax.TupleGetItem):
            return self.builder_.emit(
                relax.TupleGetItem(self._operand(expr.tuple_value), expr.index))
        return self.visit_expr(expr)


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
