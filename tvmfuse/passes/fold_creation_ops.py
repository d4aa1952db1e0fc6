"""FoldCreationOps: ``arange``, ``zeros``, ``ones`` and ``full`` of static arguments (and
``zeros_like``, ``ones_like`` and ``full_like`` of tensors of static shape) become constants, so
that ``FoldConstant`` evaluates what is computed from them in float32, before the precision
changes. (TVM's own legalization of a ``full_like`` of -inf, Llama 4's attention mask, fails:
it tests its dtype with ``in``, and the dtype is no longer a string.)

Relax's ``FoldConstant`` evaluates a call only when its arguments are constants, and these ops'
arguments are numbers and shapes: a chain that starts at one (a rotary table from
``arange(seq)``, a causal mask) stayed unevaluated until the legalize phase, by when
``ToMixedPrecision`` had narrowed it. transformers 5.17's Llama computes its rotary angles as a
matmul ``inv_freq @ positions`` (with autocast off, so in float32 even in a float16 model);
narrowed, the angles of positions up to 36 lost up to 0.004 rad and the keys output of a fp16
build was 1.1x PyTorch fp16's error (0.5x with the angles in float32).

Preconditions: any Relax; run before ``FoldConstant`` and ``ToMixedPrecision``.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ._rewrite import mutate_functions, static_shape

#: A creation larger than this many elements stays a call (a constant is stored in the library).
MAX_ELEMENTS = 1 << 22


@tvm.transform.module_pass(opt_level=0, name="FoldCreationOps")
class FoldCreationOps:
    """Evaluate creation ops of static arguments at build time; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return mutate_functions(mod, _Creations(mod))


def _numbers(exprs) -> list | None:
    """The Python numbers of static ``IntImm``/``FloatImm`` arguments, or None."""
    if all(isinstance(e, (tvm.tirx.IntImm, tvm.tirx.FloatImm)) for e in exprs):
        return [e.value for e in exprs]
    return None


def _value(call: relax.Call) -> np.ndarray | None:
    """What ``call`` creates, or None when its arguments are not all static."""
    name, dtype = call.op.name.removesuffix("_like"), str(call.ty.dtype)
    if name == "relax.arange":
        bounds = _numbers(call.args)
        return None if bounds is None else np.arange(*bounds).astype(dtype)
    shape = static_shape(call.ty.shape)
    if shape is None:
        return None
    if name == "relax.full":
        fill = call.args[1]
        if not isinstance(fill, tvm.ir.expr.Constant):
            return None
        return np.full(shape, fill.value.numpy(), dtype=dtype)
    return (np.zeros if name == "relax.zeros" else np.ones)(shape, dtype=dtype)


_CREATIONS = ("relax.arange", "relax.zeros", "relax.ones", "relax.full", "relax.zeros_like",
              "relax.ones_like", "relax.full_like")


@relax.expr_functor.mutator
class _Creations(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name in _CREATIONS):
            return call
        sizes = static_shape(getattr(call.ty, "shape", None))
        if sizes is None or np.prod(sizes, dtype=np.int64) > MAX_ELEMENTS:
            return call
        value = _value(call)
        if value is None or list(value.shape) != sizes:
            return call
        return relax.const(value, str(call.ty.dtype))
