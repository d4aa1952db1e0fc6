"""WidenEpilogues: in a float16 or bfloat16 build, a fused GEMM's or conv's bias, scale and
activation are computed on its float32 sums and rounded to the narrow type once, where that
chain ends (a residual add, a cast, the kernel's output).

``ToMixedPrecision`` gives the ops after a matmul the narrow type, and the legalization rounds
the matmul's float32 sums to it (:mod:`tvmfuse.strategy.accumulate`): ``gelu(add(round(sums),
bias))`` rounds three times, the last two in half-precision arithmetic. PyTorch's ``addmm``
adds the bias to the float32 sums and its GELU computes in float32, one rounding each; BERT-base
was the less accurate of the two on the H200 (fp16 batch 1: 1.17e-3 against torch.compile's
1.15e-3; bf16 batch 32: 9.65e-3 against 9.50e-3), and is the more accurate with this pass
(1.08e-3; 9.32e-3). Within each group the patterns formed, this pass writes the anchor with a
float32 ``out_dtype`` and the ops after it in float32 (the bias widened) up to the first op it
does not take (:data:`_ELEMENTWISE`; an op that also reads a full-size tensor, a residual:
PyTorch rounds before its add too), and rounds there. Which ops a kernel holds does not change.

Preconditions: after FuseOpsByPattern (inside its groups), before LegalizeOps.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from ._rewrite import NARROW_FLOATS, WITH_OUT_DTYPE, static_shape

#: The sums' type by default.
WIDE = "float32"
#: Elementwise ops an epilogue computes in float32: the bias (or a folded scale) and the
#: activations whose float32 form every CUDA schedule compiles. Not ReLU and ReLU6's maximum and
#: minimum: rounding to nearest is monotonic and keeps zero, so they give the same narrow result
#: either side of it. Not sigmoid, SiLU or GELU's tanh form, nor constant operands: in a
#: TVM-scheduled kernel that stores 8 narrow lanes at a time they make float32 vectors of a
#: broadcast constant, which TVM's CUDA code generator prints as a ``make_ulonglong4`` of eight
#: floats (nvcc: "too many arguments in function call"; checked with nvcc for each activation).
_ELEMENTWISE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide",
                "relax.nn.gelu", "relax.tanh")


@tvm.transform.module_pass(opt_level=0, name="WidenEpilogues")
class WidenEpilogues:
    """Compute the fused epilogues of narrow matmuls and convs on their sums, of type
    ``accumulator`` (the build's: ``BuildOptions.accumulator``; None, narrow sums, leaves
    every group as it is); see the module docstring."""

    def __init__(self, accumulator: str | None = WIDE):
        self.accumulator = accumulator

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if self.accumulator is None:
            return mod
        updated = mod.clone()
        for gvar, func in mod.functions.items():
            if (isinstance(func, relax.Function) and "Composite" in func.attrs
                    and len(func.body.blocks) == 1):
                wide, narrowed = _widened_chain(func)
                if wide:
                    updated[gvar] = _Widen(updated, wide, narrowed,
                                           self.accumulator).visit_expr(func)
        return updated


def _widened_chain(func: relax.Function) -> tuple[set, set]:
    """The group's bindings computed in float32 (a narrow anchor and the elementwise ops after
    it that read only it, their float32 predecessors and small tensors: a bias), and those of
    them read outside that chain (rounded to the narrow type there)."""
    wide, narrowed = set(), set()
    for binding in func.body.blocks[0].bindings:
        value = binding.value
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            continue
        if value.op.name in WITH_OUT_DTYPE and str(value.ty.dtype) in NARROW_FLOATS:
            wide.add(binding.var)
        elif value.op.name in _ELEMENTWISE and str(value.ty.dtype) in NARROW_FLOATS and any(
                arg in wide for arg in value.args) and all(
                arg in wide or _broadcast(arg, value) for arg in value.args):
            wide.add(binding.var)
        narrowed.update(arg for arg in value.args
                        if arg in wide and binding.var not in wide)
    if func.body.body in wide:
        narrowed.add(func.body.body)
    return wide, narrowed


def _broadcast(arg: relax.Expr, call: relax.Call) -> bool:
    """``arg`` is a tensor smaller than ``call``'s result (a bias, a scale: read again at every
    row), not a full-size input (a residual) nor a constant (see :data:`_ELEMENTWISE`), and
    read along the output's columns: a scalar (CLIP's quick-GELU factor, a 0-d parameter of
    the group) is broadcast across a vector, which widened is the float32x8 broadcast TVM's
    CUDA codegen prints as ``make_ulonglong4`` of 8 floats (CLIP's fp16 build did not compile)."""
    if isinstance(arg, tvm.ir.expr.Constant):
        return False
    small, full = static_shape(getattr(arg.ty, "shape", None)), static_shape(call.ty.shape)
    return bool(small) and full is not None and small[-1] == full[-1] > 1 \
        and math.prod(small) < math.prod(full)


@relax.expr_functor.mutator
class _Widen(relax.PyExprMutator):
    """Rewrites one group: the ``wide`` bindings in float32, a narrowing of each of
    ``narrowed`` where it is read."""

    def __init__(self, mod: tvm.IRModule, wide: set, narrowed: set, accumulator: str):
        super().__init__(mod)
        self.wide, self.narrowed, self.accumulator = wide, narrowed, accumulator
        self.wide_of = {}  # a wide binding's variable -> its float32 value's

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var not in self.wide:
            super().visit_var_binding_(binding)
            return
        value = binding.value
        if value.op.name in WITH_OUT_DTYPE:
            call = WITH_OUT_DTYPE[value.op.name](self.visit_expr(value), self.accumulator)
        else:
            call = relax.Call(value.op, [self._wide(arg) for arg in value.args], value.attrs,
                              value.ty_args)
        self.wide_of[binding.var] = self.builder_.emit(call, name_hint="wide")
        if binding.var in self.narrowed:
            # (the group's output leaves the dataflow block)
            emit = (self.builder_.emit if isinstance(binding.var, relax.DataflowVar)
                    else self.builder_.emit_output)
            narrow = emit(relax.op.astype(self.wide_of[binding.var], value.ty.dtype),
                          name_hint=binding.var.name)
            self.set_var_remap(binding.var, narrow)

    def _wide(self, arg: relax.Expr) -> relax.Expr:
        if arg in self.wide:
            return self.wide_of[arg]
        return self.builder_.emit(relax.op.astype(self.visit_expr(arg), self.accumulator))
