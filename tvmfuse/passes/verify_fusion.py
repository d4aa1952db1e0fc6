"""VerifyFusion: the numeric gate on fused groups.

Each fused group is built twice, as one kernel and as its ops one by one, run on the same random
inputs and compared by relative L2 error (tolerance by dtype, as in ``tvmfuse.verify``). A group
that fails to lower or build, or disagrees beyond tolerance, is split back into its ops with a
warning naming its rule and the reason; the rest of the model keeps its fusion. Where the target
cannot run on this machine only the build is checked.

Preconditions: after FuseOps (groups are primitive Relax functions of legalized ops), before
FuseTIR.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

from .. import names
from ..runtime import to_numpy
from ..verify import relative_error

log = logging.getLogger(__name__)

Build = Callable[[tvm.IRModule], object]  # a module with one group -> a relax Executable


@tvm.transform.module_pass(opt_level=0, name="VerifyFusion")
class VerifyFusion:
    """Split back every fused group that fails to build or to match its unfused ops.

    Parameters
    ----------
    build : callable
        Builds a standalone module (``main`` calling one group) for the target.
    device : tvm.runtime.Device or None
        Where to run the two builds; None checks only that the fused group builds.
    tolerance : dict
        Largest relative L2 error per output dtype.
    """

    def __init__(self, build: Build, device, tolerance: dict[str, float]):
        self.build = build
        self.device = device
        self.tolerance = tolerance
        self.split: dict[str, str] = {}  # group name -> why it was split back
        self.unchecked: list[str] = []  # groups with symbolic shapes

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        failing = {}
        groups = _called_groups(mod)
        for gvar in groups:
            reason = self._check(mod, gvar)
            if reason is not None:
                func = mod[gvar]
                rule = str(func.attrs.get(names.COMPOSITE, names.ELEMENTWISE))
                log.warning("fusion %s (%s) split back into its ops: %s", rule, gvar.name_hint,
                            reason)
                self.split[gvar.name_hint] = reason
                failing[gvar] = func
        log.info("verify-fusion: %d fused group(s) %s, %d split back, %d with symbolic shapes "
                 "not checked", len(groups) - len(self.unchecked),
                 "built and compared" if self.device else "built", len(failing),
                 len(self.unchecked))
        if not failing:
            return mod
        updated = mod.clone()
        updated["main"] = mod["main"].inline_functions(failing)
        for gvar in failing:
            del updated[gvar]
        return relax.transform.CanonicalizeBindings()(updated)

    def _check(self, mod: tvm.IRModule, gvar: tvm.ir.GlobalVar) -> str | None:
        func = mod[gvar]
        shapes = [_static_shape(p.ty) for p in func.params]
        if any(s is None for s in shapes):
            self.unchecked.append(gvar.name_hint)
            return None
        fused = _standalone(mod, gvar)
        unfused = fused.clone()
        unfused["main"] = fused["main"].inline_functions({fused.get_global_var(gvar.name_hint):
                                                          fused[gvar.name_hint]})
        del unfused[gvar.name_hint]
        try:
            fused_exe = self.build(fused)
        except Exception as err:  # noqa: BLE001 - any failure to lower or build splits the group
            return f"fails to build: {_first_line(err)}"
        if self.device is None:
            return None
        inputs = [_random(shape, str(p.ty.dtype), i) for i, (p, shape) in
                  enumerate(zip(func.params, shapes))]
        outs = _run(fused_exe, inputs, self.device)
        refs = _run(self.build(unfused), inputs, self.device)
        return _compare(func, outs, refs, self.tolerance)


def _compare(func, outs, refs, tolerance) -> str | None:

    for i, (out, ref) in enumerate(zip(outs, refs)):
        err, tol = relative_error(out, ref), tolerance.get(str(out.dtype), 0.0)
        if not err <= tol:
            return (f"output {i} differs from the unfused ops: relative L2 error {err:.2e} > "
                    f"{tol:.0e}")
    return None


def _called_groups(mod: tvm.IRModule) -> list[tvm.ir.GlobalVar]:
    groups = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar)
                    and isinstance(mod[value.op], relax.Function)
                    and mod[value.op].attrs.get("Primitive", False)):
                groups.append(value.op)
    return groups


def _standalone(mod: tvm.IRModule, gvar: tvm.ir.GlobalVar) -> tvm.IRModule:
    """A module whose ``main`` calls only the group, with the PrimFuncs the group calls."""
    func = mod[gvar]
    callees = {gvar}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and value.args and isinstance(value.args[0],
                                                                           tvm.ir.GlobalVar):
                callees.add(value.args[0])
    bb = relax.BlockBuilder(tvm.IRModule({g: mod[g] for g in callees}))
    params = [relax.Var(p.name, p.ty) for p in func.params]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.Call(bb.get().get_global_var(gvar.name_hint), params))
        bb.emit_func_output(out)
    return bb.get()


def _static_shape(ty) -> tuple[int, ...] | None:
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = ty.shape.values
    if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return tuple(int(d) for d in dims)


def _random(shape, dtype: str, seed: int) -> np.ndarray:
    if np.issubdtype(np.dtype(dtype), np.floating):
        return np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype)  # indices and masks: zero is always in range


def _run(executable, inputs, device) -> list[np.ndarray]:

    vm = relax.VirtualMachine(executable, device)
    result = vm["main"](*[tvm.runtime.tensor(a, device) for a in inputs])
    return to_numpy(result)


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[-1][:200]
