"""What a pipeline made of a model: its kernels and its fusion groups, read off the IR."""

from __future__ import annotations

import re
from dataclasses import dataclass

import tvm
from tvm import relax

from . import names
from .targets import relax_backend


@dataclass(frozen=True)
class FusionGroup:
    """One fused kernel: its Relax function, the rule that made it (a tvmfuse pattern name, or
    ``elementwise`` for TVM's FuseOps on what the patterns left), its ops, in order, and the
    shapes of what it reads and writes (symbolic dimensions as their names)."""

    name: str
    rule: str
    ops: tuple[str, ...]
    inputs: tuple[tuple, ...] = ()
    output: tuple = ()

    def to_json(self) -> dict:
        return {"name": self.name, "rule": self.rule, "ops": list(self.ops),
                "inputs": [list(s) for s in self.inputs], "output": list(self.output)}


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
    that holds more than one op, and each kernel a tvmfuse pass wrote for several ops."""
    groups = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if _is_op(value, "relax.call_tir"):
                kernel = mod[value.args[0]]  # a kernel a tvmfuse pass wrote (fused attention)
                if names.FUSION in (kernel.attrs or {}):
                    ops = tuple(str(op) for op in kernel.attrs[names.FUSION_OPS])
                    groups.append(FusionGroup(value.args[0].name_hint,
                                              str(kernel.attrs[names.FUSION]), ops,
                                              *_shapes(value.args[1].fields, value)))
                continue
            if not (isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar)):
                continue
            func = mod[value.op]
            if not isinstance(func, relax.Function):
                continue
            ops = tuple(_op_names(func))
            if len(ops) > 1:
                rule = str(func.attrs.get(names.COMPOSITE, names.ELEMENTWISE))
                groups.append(FusionGroup(value.op.name_hint, rule, ops,
                                          *_shapes(value.args, value)))
    return groups


def _shapes(args, call) -> tuple[tuple[tuple, ...], tuple]:
    """The shapes of a kernel call's tensor arguments and of its result."""
    return (tuple(s for s in (_shape(a.ty) for a in args) if s is not None),
            _shape(call.ty) or ())


def _shape(ty) -> tuple | None:
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    return tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape.values)


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


@dataclass(frozen=True)
class Summary:
    """Kernels one inference launches, and the bytes they move: each kernel's inputs read once
    and its outputs written once (symbolic dimensions counted as 1)."""

    kernels: int
    bytes: int

    def to_json(self) -> dict:
        return {"kernels": self.kernels, "bytes": self.bytes}


def summarize(mod: tvm.IRModule) -> Summary:
    """Kernels and bytes moved of ``main`` in a module after FuseTIR (or after LegalizeOps)."""
    kernels, moved = 0, 0
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if _is_op(value, "relax.call_tir", "relax.call_dps_packed"):
                kernels += 1
                inputs = value.args[1]
                args = inputs.fields if isinstance(inputs, relax.Tuple) else [inputs]
                read = {a: None for a in args}  # a tensor passed twice is read once
                moved += sum(_bytes(a.ty) for a in read) + _bytes(value.ty)
    return Summary(kernels, moved)


def _bytes(ty) -> int:
    if isinstance(ty, relax.TupleType):
        return sum(_bytes(f) for f in ty.fields)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return 0
    count = 1
    for dim in ty.shape.values:
        count *= int(dim) if isinstance(dim, tvm.tirx.IntImm) else 1
    return count * tvm.runtime.DataType(str(ty.dtype)).bits // 8


def unfused(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """Every op its own kernel: the imported module legalized with no fusion at all."""
    passes = tvm.transform.Sequential([
        relax.transform.DecomposeOpsForInference(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.LegalizeOps(),
        relax.transform.FoldConstant(),
    ])
    with target:
        return passes(mod)


def stock_fused(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """What TVM's own fusion makes of the imported module: its backend's legalize passes
    (LegalizeOps, FoldConstant, FuseOps, FuseTIR)."""
    backend = relax_backend(target.kind.name)
    with target:
        return tvm.transform.Sequential(backend.legalize_passes(target))(mod)


def stock_kernel_calls(mod: tvm.IRModule, target: tvm.target.Target) -> list[str]:
    """The kernels stock ``tvm.compile`` launches for ``mod``: on CPU it legalizes and fuses
    nothing (see relax/vm_build.py); on CUDA it runs the backend's FuseOps and dlight."""
    if target.kind.name == "cuda":
        passes = tvm.transform.Sequential(relax_backend("cuda").legalize_passes(target))
    else:
        passes = relax.transform.LegalizeOps()
    with target:
        return kernel_calls(passes(mod))
