"""Time a kernel as a build runs it, so that seeds and search candidates compare.

A build moves each kernel's weight packing out of it (:class:`tvmfuse.passes.PrepackWeights`:
the packing runs once, on the constant) and lowers the kernel with the target family's TIR
pipeline (on CPUs ``tvmfuse.cpu``: the last column tile apart, NaN-propagating max and min).
:func:`as_built` does the same to one scheduled kernel and :class:`Timer` times the result on
random arguments of its parameters, here or on an RPC device. MetaSchedule's own builder and
runner did neither: they timed a weight padded to whole tiles with its packing (a classifier
GEMM measured 19x slower than the build runs it) and lowered without the part-tail split.

Comparisons are only meaningful between times taken close together on one machine: the
machines this runs on swing by tens of percent over minutes. :func:`alternate` times several
kernels round-robin, and :func:`beats` says whether one is faster by more than the spread.
"""

from __future__ import annotations

import concurrent.futures
import gc
import itertools
import logging
import os
import shutil
import statistics
from collections.abc import Sequence

import tvm
from tvm import relax, s_tir, tirx
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

from ..names import LAYOUT_REWRITE_PREPROC
from ..passes.prepack_weights import PACKED, with_prepack_blocks
from ..profile import param_specs, random_args
from ..remote import Remote, SharedLibraryExport

log = logging.getLogger(__name__)

#: Seconds a worker may take to build one kernel (MetaSchedule's builder allows the same), and
#: the kernels a worker builds before a fresh one replaces it: compiling in workers keeps what
#: LLVM allocates for a candidate (some of MetaSchedule's generic candidates are unrolled far)
#: out of the tuning process, and recycling them bounds what the workers keep.
BUILD_TIMEOUT_S, WORKER_USES = 120, 64


def as_built(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """The scheduled kernel ``func`` as a build calls it: its weight-packing blocks moved out
    (the packed weights become its parameters), as PrepackWeights moves them."""
    func = with_prepack_blocks(func)
    sch = s_tir.Schedule(func)
    children = sch.get_child_blocks(sch.get_sblock("root"))
    if not any(LAYOUT_REWRITE_PREPROC in sch.get(b).annotations for b in children):
        return func
    params = list(func.params)  # buffers, in TIRx
    buffers = [param.ty for param in params]
    written = {i for b in children for region in sch.get(b).writes
               for i, param in enumerate(params) if region.source.same_as(param)}
    first_output = min(written)
    # SplitLayoutRewritePreproc works on a call site: one calling ``func`` on its parameters
    builder = relax.BlockBuilder()
    kernel = builder.add_func(func.with_attr("global_symbol", "kernel"), "kernel")
    inputs = [relax.Var(f"x{i}", relax.TensorType(buffer.shape, buffer.dtype))
              for i, buffer in enumerate(buffers[:first_output])]
    outputs = [relax.TensorType(b.shape, b.dtype) for b in buffers[first_output:]]
    with builder.function("main", inputs):
        call = builder.emit(relax.call_tir(kernel, inputs, outputs if len(outputs) > 1
                                           else outputs[0]))
        builder.emit_func_output(call)
    split = relax.transform.SplitLayoutRewritePreproc()(builder.get())
    return next(f for g, f in split.functions.items() if g.name_hint == "kernel" + PACKED)


class Timer:
    """Seconds per call of scheduled kernels, as :func:`as_built` makes them, here or on the
    devices an RPC tracker holds under a key (sessions held for the timer's life).

    ``tir_pipeline``: the target family's lowering (:meth:`tvmfuse.strategy.Strategy.
    tir_pipeline`). Each timing is the median of ``repeat`` runs of at least ``min_repeat_ms``.
    Kernels are compiled in ``build_workers`` worker processes (default: one a core) into
    shared libraries, loaded as a build's library is loaded.
    Over RPC, :meth:`time_many` spreads kernels over every device of the key that was free when
    the first was asked for (``devices`` at most); :meth:`load` and :meth:`__call__` time on the
    first, so that timings compared with each other come from one device.
    """

    def __init__(self, target, tir_pipeline: str, *, remote: Remote | None = None,
                 cross_cc: str | None = None, repeat: int = 3, min_repeat_ms: int = 50,
                 devices: int | None = None, build_workers: int | None = None):
        self.target, self.tir_pipeline = target, tir_pipeline
        self.remote, self.cross_cc = remote, cross_cc
        self.repeat, self.min_repeat_ms = repeat, min_repeat_ms
        self.devices = devices
        self.build_workers = build_workers or os.cpu_count() or 1
        self._sessions: list = []
        self._workers: PopenPoolExecutor | None = None
        self._uploads = itertools.count()  # next() is atomic: the devices' threads share it

    def __enter__(self) -> Timer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End the RPC sessions (the tracker lends a device to one session at a time: left
        open, the next session waited for its timeout) and the build workers."""
        self._sessions = []
        if self._workers is not None:
            self._workers.shutdown()
            self._workers = None
        gc.collect()

    def sessions(self) -> list:
        """The RPC sessions (opened on first use: every device of the key free then)."""
        if not self._sessions:
            count = self.remote.free_devices()
            if self.devices is not None:
                count = min(count, self.devices)
            self._sessions = [self.remote.session() for _ in range(max(count, 1))]
            if len(self._sessions) > 1:
                log.info("timing on %d devices of %s", len(self._sessions), self.remote)
        return self._sessions

    def _pool(self) -> PopenPoolExecutor:
        if self._workers is None:
            self._workers = PopenPoolExecutor(max_workers=self.build_workers,
                                              timeout=BUILD_TIMEOUT_S,
                                              maximum_process_uses=WORKER_USES)
        return self._workers

    def build_many(self, funcs: Sequence[tirx.PrimFunc]) -> list[tuple[str, tuple] | Exception]:
        """Each of ``funcs`` (scheduled) as built, compiled in the worker processes into a
        shared library: (its path, its parameters' specs), or the error it failed with."""
        built: list = []
        jobs = []
        for func in funcs:
            try:
                kernel = as_built(func)
                specs = param_specs(kernel)
                if specs is None:
                    raise ValueError("a kernel with symbolic shapes cannot be timed alone")
                jobs.append((len(built), kernel.with_attr("global_symbol", "main"), specs))
                built.append(None)
            except Exception as err:  # noqa: BLE001 - a candidate that does not lower
                built.append(err)
        results = self._pool().map_with_error_catching(
            lambda job: _compile_and_export(*job),
            [(tvm.IRModule({"main": kernel}), self.target, self.tir_pipeline, self.cross_cc)
             for _, kernel, _ in jobs])
        for (index, _, specs), result in zip(jobs, results):
            if result.status == StatusKind.COMPLETE:
                built[index] = (result.value, specs)
            else:
                reason = "timed out" if result.status == StatusKind.TIMEOUT else result.value
                built[index] = RuntimeError(f"building the kernel failed: {reason}")
        return built

    def load(self, funcs: Sequence[tirx.PrimFunc], device: int = 0) -> list:
        """A callable ``() -> seconds`` for each of ``funcs`` (scheduled, built together),
        timing it on fixed random arguments, on the ``device``-th RPC device (over RPC) or
        here; the first error a kernel failed with is raised."""
        built = self.build_many(funcs)
        failed = next((b for b in built if isinstance(b, Exception)), None)
        if failed is not None:
            raise failed
        return [self._loaded(*found, device) for found in built]

    def _loaded(self, path: str, specs, device_index: int):
        kind = "cuda" if self.target.kind.name == "cuda" else "cpu"
        try:
            if self.remote is None:
                module, device = tvm.runtime.load_module(path), tvm.device(kind, 0)
            else:
                session = self.sessions()[device_index]
                # a name of its own: a second library loaded from one path is the first again
                name = f"kernel-{os.getpid()}-{next(self._uploads)}.so"
                session.upload(path, target=name)
                module = session.load_module(name)
                device = session.device(kind, 0)
        finally:  # loaded (the mapping outlives the file) or sent: not needed here any more
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        args = random_args(specs, device)
        timer = module.time_evaluator("main", device, number=1, repeat=self.repeat,
                                      min_repeat_ms=self.min_repeat_ms)
        return lambda: float(statistics.median(timer(*args).results))

    def __call__(self, func: tirx.PrimFunc) -> float:
        """Seconds per call of ``func`` (scheduled)."""
        (timing,) = self.load([func])
        return timing()

    def time_many(self, funcs: Sequence[tirx.PrimFunc]) -> list[float | Exception]:
        """Seconds per call of each of ``funcs``, or the error it failed with: built in the
        worker processes, timed here or on the RPC devices in parallel (one kernel at a time
        each)."""
        built = self.build_many(funcs)
        devices = len(self.sessions()) if self.remote is not None else 1

        def run(index: int, device: int) -> float | Exception:
            if isinstance(built[index], Exception):
                return built[index]
            try:
                return self._loaded(*built[index], device)()
            except Exception as err:  # noqa: BLE001 - a candidate that fails to run
                return err

        if devices == 1:
            return [run(i, 0) for i in range(len(funcs))]
        with concurrent.futures.ThreadPoolExecutor(devices) as pool:
            def on_device(device: int) -> list[tuple[int, float | Exception]]:
                return [(i, run(i, device)) for i in range(device, len(funcs), devices)]

            results = dict(pair for chunk in pool.map(on_device, range(devices))
                           for pair in chunk)
        return [results[i] for i in range(len(funcs))]


def _compile_and_export(mod: tvm.IRModule, target, tir_pipeline: str,
                        cross_cc: str | None) -> str:
    """In a worker process: ``mod`` compiled for ``target`` with ``tir_pipeline`` (tvmfuse's
    are registered by importing its strategies) into a shared library; its path."""
    from .. import strategy  # noqa: F401, PLC0415 - registers tvmfuse's TIR pipelines

    library = tvm.compile(mod, target=target, tir_pipeline=tir_pipeline)
    return SharedLibraryExport(cross_cc)(library.mod)


def alternate(timings: Sequence, rounds: int) -> list[list[float]]:
    """Call each of ``timings`` (from :meth:`Timer.load`) ``rounds`` times, round-robin, so that
    a drift of the machine's speed falls on all alike; the seconds of each, in order."""
    seconds: list[list[float]] = [[] for _ in timings]
    for _ in range(rounds):
        for times, timing in zip(seconds, timings):
            times.append(timing())
    return seconds


def _kept(seconds: Sequence[float]) -> list[float]:
    """``seconds`` sorted, without the slowest where three or more remain: another job sharing
    the cores only ever adds time, so one round it hit says nothing of the kernel."""
    ordered = sorted(seconds)
    return ordered[:-1] if len(ordered) > 3 else ordered


def spread(seconds: Sequence[float]) -> float:
    """Half the range of ``seconds`` without the slowest (:func:`_kept`): how far one timing of
    the kernel strays from another."""
    kept = _kept(seconds)
    return (max(kept) - min(kept)) / 2


def beats(candidate: Sequence[float], baseline: Sequence[float]) -> bool:
    """Whether ``candidate`` is faster than ``baseline``, in timings taken alternately
    (:func:`alternate`): its median below the baseline's by more than the spread of both (the
    larger of their half-ranges), or every timing of it (but the slowest) below every timing of
    the baseline. The second holds where interference hit the baseline in several rounds and
    widened its range past a gain that no timing leaves in doubt."""
    gain = statistics.median(baseline) - statistics.median(candidate)
    return (gain > max(spread(candidate), spread(baseline))
            or max(_kept(candidate)) < min(baseline))
