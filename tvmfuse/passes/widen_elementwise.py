"""WidenElementwise: in a float16 or bfloat16 build, the elementwise chains outside the fusion
patterns' groups compute in float32 and round to the narrow type once, where the chain's value
leaves it (a matmul, a layout op, a reduction, the function's output).

``ToMixedPrecision`` gives every op after a narrow matmul the narrow type, and each op then rounds:
Llama's SiLU-gated MLP, ``silu(gate) * up`` as ``x * sigmoid(x) * up``, is six roundings in
half-precision arithmetic on CUDA (``1 / (1 + hexp(0 - x))``, then two products), where PyTorch's
SiLU computes in float32 and rounds once, and its product once more. This pass does what
PyTorch's kernels do inside one op for the whole chain: each input of the chain is widened once,
the ops compute in float32, and the value is rounded where it is read by anything other than such
an op. A value read only by the
chain's ops is never stored narrow; one read also elsewhere is rounded once and every reader
takes the rounded value (so a kernel boundary there stores the narrow type, as before). A widening
cast reads the wide value too, and a narrow matmul or conv read only by widened ops and widenings
keeps its float32 sums: Llama's output projections feed a float32 residual stream and its last
GEMM a float32 output, each through a rounding to float16 and back. The groups the patterns
formed keep their own arithmetic (:mod:`.widen_epilogues` widens those). Llama prefill fp16
(small config, six inputs, this CPU): relative error 0.65x PyTorch fp16's before, 0.56x after.

Preconditions: after FuseOpsByPattern, before LegalizeOps.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._rewrite import NARROW_FLOATS, WITH_OUT_DTYPE
from .widen_epilogues import WIDE

#: Ops whose narrow result is a rounding of a wider one: arithmetic and the activations'
#: transcendental functions. Not negation, maximum, minimum or ReLU (exact in any type), nor
#: layout ops (they move values: the chain's rounding point).
_ELEMENTWISE = frozenset(f"relax.{name}" for name in (
    "add", "subtract", "multiply", "divide", "power", "sigmoid", "exp", "log", "tanh", "erf",
    "sqrt", "rsqrt", "nn.silu", "nn.gelu", "nn.gelu_tanh"))


@tvm.transform.module_pass(opt_level=0, name="WidenElementwise")
class WidenElementwise:
    """Compute narrow elementwise chains outside the fusion groups in ``accumulator`` (the
    build's: ``BuildOptions.accumulator``; None leaves the module as it is); see the module
    docstring."""

    def __init__(self, accumulator: str | None = WIDE):
        self.accumulator = accumulator

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if self.accumulator is None:
            return mod
        updated, changed = mod.clone(), False
        for gvar, func in mod.functions.items():
            if (isinstance(func, relax.Function) and not func.attrs.get("Primitive", False)
                    and any(_widens(b.value) or _narrow_sums(b.value)
                            for block in func.body.blocks for b in block.bindings)):
                kept_wide = _read_only_by_chains(func, self.accumulator)
                updated[gvar] = _Widen(updated, kept_wide, self.accumulator).visit_expr(func)
                changed = True
        return relax.transform.DeadCodeElimination()(updated) if changed else mod


def _narrow_call(value: relax.Expr, ops) -> bool:
    """``value`` calls one of ``ops`` and has a narrow result."""
    return (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name in ops and str(getattr(value.ty, "dtype", "")) in NARROW_FLOATS)


def _widens(value: relax.Expr) -> bool:
    """``value`` is a narrow elementwise op this pass computes in float32."""
    return _narrow_call(value, _ELEMENTWISE)


def _narrow_sums(value: relax.Expr) -> bool:
    """``value`` is a matmul or conv with a narrow result (its sums are float32, rounded)."""
    return _narrow_call(value, WITH_OUT_DTYPE)


def _widening(value: relax.Expr, accumulator: str) -> relax.Expr | None:
    """The narrow value ``value`` widens to ``accumulator``, if it is such a cast."""
    if (isinstance(value, relax.Call) and value.op == tvm.ir.Op.get("relax.astype")
            and str(value.ty.dtype) == accumulator
            and str(getattr(value.args[0].ty, "dtype", "")) in NARROW_FLOATS):
        return value.args[0]
    return None


def _read_only_by_chains(func: relax.Function, accumulator: str) -> set[relax.Var]:
    """The variables of widened ops and narrow matmuls whose every reader is a widened op or a
    widening cast: they need no narrow copy (the matmuls keep their float32 sums)."""
    candidates, elsewhere = set(), set()
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if _widens(value) or _narrow_sums(value):
                candidates.add(binding.var)
            chain_reader = _widens(value) or (_widening(value, accumulator) is not None and
                                              isinstance(binding.var, relax.DataflowVar))
            if not chain_reader:
                elsewhere.update(relax.analysis.free_vars(value))
            if not isinstance(binding.var, relax.DataflowVar):  # leaves the dataflow block
                elsewhere.add(binding.var)
    elsewhere.update(relax.analysis.free_vars(func.body.body))
    return candidates - elsewhere


@relax.expr_functor.mutator
class _Widen(relax.PyExprMutator):
    """Rewrites one function: each widened op in ``accumulator`` on its inputs' wide values, a
    narrowing where it is read by other ops (unless it is in ``kept_wide``); the narrow matmuls
    in ``kept_wide`` keep their sums, and their widenings (and a widened op's) read the wide
    value."""

    def __init__(self, mod: tvm.IRModule, kept_wide: set, accumulator: str):
        super().__init__(mod)
        self.kept_wide, self.accumulator = kept_wide, accumulator
        self.wide_of = {}  # a narrow value (a variable, or a constant) -> its float32 value

    def visit_dataflow_block_(self, block: relax.DataflowBlock) -> relax.BindingBlock:
        self.wide_of = {}  # a block's variables are not defined in the next one
        return super().visit_dataflow_block_(block)

    def visit_binding_block_(self, block: relax.BindingBlock) -> relax.BindingBlock:
        self.wide_of = {}
        return super().visit_binding_block_(block)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        widened = _widening(value, self.accumulator)
        if widened is not None and widened in self.wide_of \
                and isinstance(binding.var, relax.DataflowVar):
            self.set_var_remap(binding.var, self.wide_of[widened])
        elif _narrow_sums(value) and binding.var in self.kept_wide:
            sums = WITH_OUT_DTYPE[value.op.name](self.visit_expr(value), self.accumulator)
            self.wide_of[binding.var] = self.builder_.emit(sums, name_hint="wide")
        elif _widens(value):
            wide = self.builder_.emit(relax.Call(value.op, [self._wide(a) for a in value.args],
                                                 value.attrs, value.ty_args), name_hint="wide")
            if binding.var in self.kept_wide:
                self.wide_of[binding.var] = wide
            else:  # its readers, widened ops included, take the rounded value
                emit = (self.builder_.emit if isinstance(binding.var, relax.DataflowVar)
                        else self.builder_.emit_output)
                self.set_var_remap(binding.var, emit(relax.op.astype(wide, value.ty.dtype),
                                                     name_hint=binding.var.name))
        else:
            super().visit_var_binding_(binding)

    def _wide(self, arg: relax.Expr) -> relax.Expr:
        if arg in self.wide_of:
            return self.wide_of[arg]
        if isinstance(arg, tvm.ir.expr.GenericConst):  # widened here, at build time
            return relax.const(arg.value.numpy().astype(self.accumulator))
        wide = self.builder_.emit(relax.op.astype(self.visit_expr(arg), self.accumulator))
        if isinstance(arg, relax.Var):
            self.wide_of[arg] = wide  # one widening of a value read by several ops
        return wide
