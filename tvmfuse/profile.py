"""Per-kernel time and GFLOP/s of a compiled model: each distinct kernel is timed alone with TVM's
``time_evaluator`` on random arguments of its parameter shapes (what MetaSchedule's runner does)
and counted as many times as the model launches it."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import tirx
from tvm.s_tir.analysis import estimate_tir_flops


@dataclass(frozen=True)
class Kernel:
    """What the profile needs of one PrimFunc: its FLOPs per launch and its parameters."""

    flops: float
    #: (shape, dtype) of every parameter, outputs included; None when a dimension is symbolic.
    params: tuple[tuple[tuple[int, ...], str], ...] | None


@dataclass(frozen=True)
class KernelTime:
    name: str
    implementation: str
    launches: int
    #: Milliseconds of all its launches in one run.
    ms: float
    #: FLOPs of all its launches in one run.
    flops: float

    @property
    def gflops(self) -> float | None:
        return self.flops / self.ms / 1e6 if self.ms > 0 and self.flops > 0 else None

    def to_json(self) -> dict:
        return {"kernel": self.name, "implementation": self.implementation,
                "launches": self.launches, "ms": round(self.ms, 4), "flops": self.flops,
                # three significant figures: a tiny kernel slowed by a busy machine (a few
                # kFLOPs over milliseconds) is not 0.0
                "gflops": None if self.gflops is None else float(f"{self.gflops:.3g}")}


def kernels(mod) -> dict[str, Kernel]:
    """Every PrimFunc of ``mod``: FLOPs (TVM's estimate, a multiply-add counts 2) and params."""

    found = {}
    for gvar, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        try:
            flops = float(estimate_tir_flops(tvm.IRModule({"main": func})))
        except Exception:  # noqa: BLE001 - symbolic shapes have no estimate
            flops = 0.0
        found[gvar.name_hint] = Kernel(flops, param_specs(func))
    return found


def param_specs(func) -> tuple[tuple[tuple[int, ...], str], ...] | None:
    """(shape, dtype) of each parameter of a PrimFunc; None when a dimension is symbolic."""

    params = []
    for param in func.params:
        buffer = param.ty
        if not hasattr(buffer, "shape"):
            return None  # a scalar parameter (a symbolic shape variable)
        if not all(isinstance(d, tirx.IntImm) for d in buffer.shape):
            return None
        params.append((tuple(int(d) for d in buffer.shape), str(buffer.dtype)))
    return tuple(params)


def profile(executable, device, launches: list[str], implementations: dict[str, str],
            kernels_: dict[str, Kernel], *, min_ms: int = 50) -> list[KernelTime]:
    """Time each kernel launched in ``launches`` (the model's kernel calls in order); slowest
    in total first. Kernels with symbolic shapes are left out."""
    library = executable.mod.imports[0]
    times = []
    for name, count in Counter(launches).items():
        kernel = kernels_.get(name)
        if kernel is None or kernel.params is None:
            continue
        if not library.implements_function(name):
            continue  # evaluated at build time (a mask from constants): never launched
        args = random_args(kernel.params, device)
        timer = library.time_evaluator(name, device, number=1, repeat=3, min_repeat_ms=min_ms)
        ms = statistics.median(timer(*args).results) * 1e3
        times.append(KernelTime(name, implementations.get(name, "default"), count, ms * count,
                                kernel.flops * count))
    return sorted(times, key=lambda k: -k.ms)


def random_args(specs, device) -> list:
    """Arguments for a kernel of parameters ``specs`` (see :func:`param_specs`) on ``device``:
    normal floats, zeros for integer and boolean tensors (indices such as embedding lookups must
    stay in range)."""

    rng = np.random.default_rng(0)

    def array(shape, dtype):
        if dtype.startswith(("int", "uint", "bool")):
            return np.zeros(shape, dtype)
        return rng.standard_normal(shape).astype(dtype)

    return [tvm.runtime.tensor(array(shape, dtype), device) for shape, dtype in specs]
