"""NarrowToBFloat16: a mixed-precision graph in bfloat16 where ToMixedPrecision wrote float16.

TVM's ToMixedPrecision converts to float16 only. Its decisions (what runs narrow, what stays in
float32: the reductions, softmax, LayerNorm) hold for bfloat16 as well, so a bf16 build runs it
and then renames the narrow type: every ``astype`` to float16, every ``out_dtype`` float16
(matmuls, convs), every float16 constant (weights, converted through float32; bfloat16 keeps
float32's range, so nothing overflows that fitted before). Types are re-derived as the bindings
are re-emitted.

Preconditions: right after ToMixedPrecision(out_dtype="float16") and before tvmfuse writes
kernels of its own into the module (FuseAttention), on a module that had no float16 before it
(a float16 model built in bf16 is narrowed as a whole, which is what was asked).
"""

from __future__ import annotations

import ml_dtypes
import tvm
from tvm import relax

from ._rewrite import NARROW_FLOATS, dtype_of, with_fields

HALF, BF16 = "float16", "bfloat16"


@tvm.transform.module_pass(opt_level=0, name="NarrowToBFloat16")
class NarrowToBFloat16:
    """Rename float16 to bfloat16 in every Relax function; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updated = mod.clone()
        for gvar, func in mod.functions.items():
            if isinstance(func, relax.Function):
                updated[gvar] = _Narrow(updated).visit_expr(func)
        return updated


@relax.expr_functor.mutator
class _Narrow(relax.PyExprMutator):
    def visit_generic_const_(self, const):
        value = const.value.numpy()
        if str(value.dtype) != HALF:
            return const
        return relax.const(value.astype("float32").astype(ml_dtypes.bfloat16), BF16)

    def visit_call_(self, call):
        call = super().visit_call_(call)
        attrs = call.attrs
        if not isinstance(call.op, tvm.ir.Op) or attrs is None:
            return call
        if call.op.name in _NORMS and dtype_of(call.args[0]) in NARROW_FLOATS:
            # a norm ToMixedPrecision let follow a float16 input (ViT's first LayerNorm, after
            # the patch embedding's add): computed in float32 and narrowed after, as the others
            # are; topi's layer_norm takes no bfloat16 (FoldConstant, which legalizes every
            # call, stopped ViT's bf16 build on it)
            args = [relax.op.astype(arg, "float32") if dtype_of(arg) in NARROW_FLOATS else arg
                    for arg in call.args]
            return relax.op.astype(relax.Call(call.op, args, attrs, call.ty_args), BF16)
        half = [name for name in ("dtype", "out_dtype")
                if hasattr(attrs, name) and str(getattr(attrs, name)) == HALF]
        if not half:
            return call
        narrowed = with_fields(attrs, dict.fromkeys(half, BF16))
        return relax.Call(call.op, call.args, narrowed, call.ty_args)


#: Ops computed in float32 when ToMixedPrecision left them a float16 input.
_NORMS = ("relax.nn.layer_norm", "relax.nn.group_norm", "relax.nn.rms_norm")
