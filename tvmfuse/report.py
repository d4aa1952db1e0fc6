"""What a pipeline made of a model: its kernels and its fusion groups, read off the IR."""

from __future__ import annotations

import re
from dataclasses import dataclass

import tvm
from tvm import relax


@dataclass(frozen=True)
class FusionGroup:
    """One fused kernel: the Relax function FuseOps made and the ops inside it, in order."""

    name: str
    ops: tuple[str, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "ops": list(self.ops)}


def kernel_calls(mod: tvm.IRModule) -> list[str]:
    """The kernels ``main`` launches per inference, in order (one entry per call)."""
    calls = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if _is_op(value, "relax.call_tir", "relax.call_dps_packed"):
                calls.append(value.args[0].name_hint)
    return calls


def fusion_groups(mod: tvm.IRModule) -> list[FusionGroup]:
    """The groups of a module after FuseOps: each primitive function called by ``main``
    that holds more than one op."""
    groups = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not (isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar)):
                continue
            func = mod[value.op]
            if not isinstance(func, relax.Function):
                continue
            ops = tuple(_op_names(func))
            if len(ops) > 1:
                groups.append(FusionGroup(value.op.name_hint, ops))
    return groups


def _op_names(func: relax.Function) -> list[str]:
    names = []
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if _is_op(value, "relax.call_tir"):
                # Legalized PrimFuncs are numbered when an op occurs twice (add, add1, ...).
                names.append(re.sub(r"\d+$", "", value.args[0].name_hint))
    return names


def _is_op(expr, *names: str) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in names


def stock_kernel_calls(mod: tvm.IRModule, target: tvm.target.Target) -> list[str]:
    """The kernels stock ``tvm.compile`` launches for ``mod``: on CPU it legalizes and fuses
    nothing (see relax/vm_build.py); on CUDA it runs the backend's FuseOps and dlight."""
    from tvm.relax.backend.cuda import pipeline as cuda_backend  # noqa: PLC0415

    if target.kind.name == "cuda":
        passes = tvm.transform.Sequential(cuda_backend.legalize_passes(target))
    else:
        passes = relax.transform.LegalizeOps()
    with target:
        return kernel_calls(passes(mod))
