"""Calibration of int8 builds: the range of every tensor a GEMM or conv would read quantized.

An int8 build first builds the model in float32 with ObserveQuantized (which returns the minimum
and maximum of each such tensor beside the model's outputs), runs it on the calibration inputs,
and quantizes with the widest range seen (min-max calibration, as ONNX Runtime's static
quantization does by default: :mod:`tvmfuse.passes.quantize_int8`). The inputs are the user's
(``--calibrate inputs.npz``) or seeded random draws of the model's inputs, the first of them the
examples ``--verify`` checks.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import numpy as np

from .errors import TvmfuseError
from .passes.quantize_int8 import STATISTICS
from .specs import CALIBRATION_SEEDS

log = logging.getLogger(__name__)


def input_sets(model, path: Path | None) -> list[list[np.ndarray]]:
    """The calibration's input sets: ``path``'s (an ``.npz`` whose arrays are named after the
    model's inputs, each with a leading axis of sets), or draws with the CALIBRATION_SEEDS."""
    if path is None:
        return [model.drawn(seed) for seed in CALIBRATION_SEEDS]
    try:
        with np.load(path) as arrays:
            stored = {name: arrays[name] for name in arrays.files}
    except (OSError, ValueError) as err:
        raise TvmfuseError(f"cannot read calibration inputs {path}: {err}; give an .npz "
                           f"(numpy.savez) with one array per model input") from None
    names = [s.name for s in model.inputs]
    missing = [n for n in names if n not in stored]
    if missing:
        raise TvmfuseError(f"{path} has no array {missing[0]!r}; it needs one per model input "
                           f"({', '.join(names)}), each with a leading axis of input sets")
    counts = {stored[n].shape[0] if stored[n].ndim else 0 for n in names}
    if len(counts) != 1 or 0 in counts:
        raise TvmfuseError(f"the arrays of {path} must each hold one or more input sets along "
                           f"their first axis, the same number for every input")
    sets = []
    for index in range(counts.pop()):
        arrays = []
        for spec in model.inputs:
            array = stored[spec.name][index]
            fixed = [d if isinstance(d, int) else None for d in spec.shape]  # None: symbolic
            if array.ndim != len(fixed) or any(d is not None and d != n
                                               for d, n in zip(fixed, array.shape)):
                raise TvmfuseError(f"{path}: {spec.name!r} has sets of shape {array.shape}, the "
                                   f"model's input is {tuple(d or '?' for d in fixed)}")
            arrays.append(array.astype(spec.dtype))
        sets.append(arrays)
    return sets


def ranges(model, target, options, build) -> tuple[tuple[float, float, float], ...]:
    """``(min, max, standard deviation)`` of each tensor the int8 build may quantize, in
    ObserveQuantized's order, over every input set:
    ``build(target, options)`` builds the observing module (``options`` as the int8 build's,
    without ranges), run here on :func:`input_sets`. A target that does not run here (a
    cross-compiled CPU) is calibrated on this host's CPU: the ranges are the model's, and the
    CPU pipelines quantize the same tensors."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415 - keep `import tvmfuse` light

    from .targets import get_target  # noqa: PLC0415

    if target.is_gpu:
        raise TvmfuseError(f"--dtype int8 builds for CPUs; {target.name} is a GPU: build it "
                           f"with --dtype fp16")
    here = target if target.why_not_runnable() is None else get_target(None)
    start = time.perf_counter()
    sets = input_sets(model, options.calibrate)
    executable = build(here, dataclasses.replace(options, int8_ranges=None))
    device = here.device_here()
    vm = relax.VirtualMachine(executable, device)
    seen = []
    for arrays in sets:
        result = vm["main"](*(tvm.runtime.tensor(a, device) for a in arrays))
        seen.append(np.array([float(t.numpy()) for t in result[1]]).reshape(-1, len(STATISTICS)))
    seen = np.stack(seen)  # [set, tensor, statistic]
    low, high = seen[:, :, 0].min(0), seen[:, :, 1].max(0)
    mean, meansq = seen[:, :, 2].mean(0), seen[:, :, 3].mean(0)
    std = np.sqrt(np.maximum(meansq - mean**2, 0.0))
    log.info("calibrated %d quantized tensors on %d input sets in %.1f s", len(low),
             len(sets), time.perf_counter() - start)
    return tuple(zip(low.tolist(), high.tolist(), std.tolist()))
