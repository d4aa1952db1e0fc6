"""Shared plumbing of the rewrite passes: apply a dpl rewrite to every non-primitive function,
and the small questions they ask of Relax expressions."""

from __future__ import annotations

import tvm
from tvm import relax
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


def calls_op(expr, name: str) -> bool:
    """``expr`` is a call of the Relax operator ``name`` (e.g. ``relax.matmul``)."""
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def static_shape(shape) -> list[int] | None:
    """The dimensions of a Relax shape when all are known integers, else None."""
    values = getattr(shape, "values", None)
    if values is None or not all(isinstance(d, tvm.tirx.IntImm) for d in values):
        return None
    return [int(d) for d in values]
