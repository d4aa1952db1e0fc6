"""Shared plumbing of the rewrite passes: apply a dpl rewrite to every non-primitive function."""

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
