"""Per-kernel time and GFLOP/s of a compiled model, measured through the Relax VM's instrument
hook (the VM calls it before and after every kernel launch)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import tvm
from tvm import relax, tirx


@dataclass(frozen=True)
class KernelTime:
    """One kernel's share of a run: launches per run, median-free mean time per run."""

    name: str
    implementation: str
    launches: int
    ms: float
    flops: float

    @property
    def gflops(self) -> float | None:
        return self.flops / self.ms / 1e6 if self.ms > 0 and self.flops > 0 else None

    def to_json(self) -> dict:
        return {"kernel": self.name, "implementation": self.implementation,
                "launches": self.launches, "ms": round(self.ms, 4), "flops": self.flops,
                "gflops": None if self.gflops is None else round(self.gflops, 1)}


def kernel_flops(mod: tvm.IRModule) -> dict[str, float]:
    """FLOPs of one launch of each PrimFunc of ``mod`` (TVM's estimate: multiply-adds count 2)."""
    from tvm.s_tir.analysis import estimate_tir_flops  # noqa: PLC0415

    flops = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            try:
                flops[gvar.name_hint] = float(estimate_tir_flops(tvm.IRModule({"main": func})))
            except Exception:  # noqa: BLE001 - symbolic shapes: no estimate
                flops[gvar.name_hint] = 0.0
    return flops


def profile(executable, device, inputs, implementations: dict[str, str],
            flops: dict[str, float], *, runs: int = 5) -> list[KernelTime]:
    """Time every kernel launch of ``runs`` runs of ``main`` (after one warm-up run); the
    kernels slowest in total first. The hook's own overhead (about a microsecond per launch)
    is included."""
    vm = relax.VirtualMachine(executable, device)
    args = [tvm.runtime.tensor(a, device) for a in inputs]
    vm["main"](*args)
    totals: dict[str, float] = {}
    launches: dict[str, int] = {}
    started = [0.0]

    def instrument(_func, name, before_run, _ret, *_args):
        if name not in implementations:
            return None  # VM builtins (allocation, shape checks)
        if before_run:
            started[0] = time.perf_counter()
        else:
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - started[0]
            launches[name] = launches.get(name, 0) + 1
        return None

    vm.set_instrument(instrument)
    for _ in range(runs):
        vm["main"](*args)
    return sorted(
        (KernelTime(name, implementations[name], launches[name] // runs, total / runs * 1e3,
                    flops.get(name, 0.0) * launches[name] / runs)
         for name, total in totals.items()),
        key=lambda k: -k.ms,
    )
