"""SelectInFloat32: what a top-k or an argmax chooses by is computed in float32 in narrow builds.

A choice among values (a mixture-of-experts router's top-k experts, an argmax) is discrete: two
logits closer than a float16 step (2.4e-4 near 0.3) can swap, and then a token goes through
another expert and the output moves by tens of percent, however close every other value is.
After ``ToMixedPrecision`` a router's logits come from a float16 GEMM over weights rounded to
float16 (GPT-OSS's small config: one token's 4th and 5th experts 1.6e-4 apart in float32, and
the float16 build chose the other one, relative error 1.1e-1 where the routing agreed 7.8e-4).
So the logits a selection reads are computed again from the float32 values they were narrowed
from: the GEMM (its activation before the cast, its weight before ``FoldConstantCasts``) and the
bias or scale after it, then the order-keeping ops up to the selection (softmax, sigmoid, exp).
Only that chain is widened, and only over a router-sized weight (MAX_WIDENED_WEIGHT); what is
not reached through it stays narrow.

Preconditions: run after ``ToMixedPrecision`` and ``StoreNarrowed`` (which would point the GEMM
at the narrowed activation again) and before ``FoldConstantCasts`` (the weights' float32 values
are the constants of the casts ``ToMixedPrecision`` leaves).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from ._rewrite import NARROW_FLOATS, calls_op, dtype_of, mutate_functions, static_shape

#: The ops that choose among their input's values by order.
SELECTIONS = ("relax.topk", "relax.argmax", "relax.argmin", "relax.argsort", "relax.sort")
#: Ops between logits and a selection that keep their order along the chosen axis.
ORDER_KEEPING = ("relax.nn.softmax", "relax.nn.log_softmax", "relax.sigmoid", "relax.exp")
#: The most elements of the constant operand of a GEMM recomputed in float32: routers' weights
#: (hidden size x experts: DeepSeek-V3's 7168 x 256 is 1.8 M) and not a vocabulary's (an argmax
#: over Qwen2's LM head, 896 x 151936, would copy 545 MB to float32).
MAX_WIDENED_WEIGHT = 1 << 22
#: Ops that move a GEMM operand's values without computing (a weight's transpose).
MOVES = ("relax.permute_dims", "relax.reshape", "relax.expand_dims", "relax.squeeze")
#: Elementwise ops a GEMM's logits pass through with a constant (a bias, a scale).
WITH_CONSTANT = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


@tvm.transform.module_pass(opt_level=0, name="SelectInFloat32")
class SelectInFloat32:
    """Recompute the narrow GEMM chains that selections read in float32; see the module
    docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return mutate_functions(mod, _Widen(mod))


def _elements(expr: relax.Expr) -> float:
    """The elements of tensor ``expr``; infinite where its shape is not known."""
    shape = static_shape(getattr(expr.ty, "shape", None))
    return float("inf") if shape is None else math.prod(shape)


@relax.expr_functor.mutator
class _Widen(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.widened: dict[relax.Expr, relax.Expr | None] = {}  # logits -> float32, once

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if calls_op(call, *SELECTIONS):
            logits = call.args[0]
            if logits not in self.widened:
                self.widened[logits] = self._float32(logits)
            wide = self.widened[logits]
            if wide is not None:
                return relax.Call(call.op, [wide, *call.args[1:]], call.attrs, call.ty_args)
        return call

    def _bound(self, expr: relax.Expr) -> relax.Expr:
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            return expr if bound is None else bound
        return expr

    def _float32(self, expr: relax.Expr) -> relax.Expr | None:
        """``expr`` (float32) computed from float32 values where it was computed from a narrow
        GEMM; None where it was not."""
        value = self._bound(expr)
        if dtype_of(expr) != "float32":
            return None
        if calls_op(value, "relax.astype") and dtype_of(value.args[0]) in NARROW_FLOATS:
            return self._logits(value.args[0])
        if calls_op(value, *ORDER_KEEPING):
            inner = self._float32(value.args[0])
            if inner is not None:
                return self.builder_.emit(relax.Call(value.op, [inner, *value.args[1:]],
                                                     value.attrs, value.ty_args))
        return None

    def _logits(self, expr: relax.Expr) -> relax.Expr | None:
        """The narrow ``expr``, a GEMM with constants applied after it, in float32; None where
        it is something else."""
        value = self._bound(expr)
        if calls_op(value, "relax.matmul"):
            if not any(self._is_constant(arg) and _elements(arg) <= MAX_WIDENED_WEIGHT
                       for arg in value.args):
                return None  # not a router: no weight, or a vocabulary's
            a, b = (self._unnarrowed(arg) for arg in value.args)
            return self.builder_.emit(relax.op.matmul(a, b, out_dtype="float32"))
        if calls_op(value, *WITH_CONSTANT):
            left, right = value.args
            if self._is_constant(right):
                inner = self._logits(left)
                return None if inner is None else self.builder_.emit(
                    relax.Call(value.op, [inner, self._unnarrowed(right)]))
            if self._is_constant(left):
                inner = self._logits(right)
                return None if inner is None else self.builder_.emit(
                    relax.Call(value.op, [self._unnarrowed(left), inner]))
        return None

    def _is_constant(self, expr: relax.Expr) -> bool:
        """Whether ``expr`` is a constant, cast or moved (a weight's transpose)."""
        value = self._bound(expr)
        while calls_op(value, "relax.astype", *MOVES):
            value = self._bound(value.args[0])
        return isinstance(value, tvm.ir.expr.Constant)

    def _unnarrowed(self, expr: relax.Expr) -> relax.Expr:
        """The float32 value a narrow ``expr`` was cast from (through the layout ops that move
        it, a weight's transpose), else ``expr`` cast to float32."""
        value = self._bound(expr)
        if calls_op(value, "relax.astype") and dtype_of(value.args[0]) == "float32":
            return value.args[0]
        if calls_op(value, *MOVES):
            return self.builder_.emit(relax.Call(value.op, [self._unnarrowed(value.args[0]),
                                                            *value.args[1:]],
                                                 value.attrs, value.ty_args))
        return self.builder_.emit(relax.op.astype(expr, "float32"))
