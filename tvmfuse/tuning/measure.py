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

import gc
import logging
import os
import statistics
from collections.abc import Sequence

import tvm
from tvm import relax, s_tir, tirx

from ..names import LAYOUT_REWRITE_PREPROC, PREPACK
from ..passes.prepack_weights import PACKED
from ..profile import param_specs, random_args
from ..remote import Remote, SharedLibraryExport

log = logging.getLogger(__name__)


def with_prepack_blocks(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its design-space packing blocks (annotated PREPACK) annotated for TVM's
    SplitLayoutRewritePreproc, as the build's packing blocks are; ``func`` itself when it has
    none."""
    try:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # noqa: BLE001 - a kernel written without blocks packs nothing
        return func
    renamed = False
    for block in blocks:
        if PREPACK in sch.get(block).annotations:
            sch.unannotate(block, PREPACK)
            sch.annotate(block, LAYOUT_REWRITE_PREPROC, True)
            renamed = True
    return sch.mod["main"] if renamed else func


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


def compile_kernel(func: tirx.PrimFunc, target, tir_pipeline: str):
    """``func`` (as :func:`as_built` makes it) compiled alone as ``main`` for ``target``."""
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    return tvm.compile(mod, target=target, tir_pipeline=tir_pipeline)


class Timer:
    """Seconds per call of scheduled kernels, as :func:`as_built` makes them, here or on an RPC
    device (one session for the timer's life).

    ``tir_pipeline``: the target family's lowering (:meth:`tvmfuse.strategy.Strategy.
    tir_pipeline`). Each timing is the median of ``repeat`` runs of at least ``min_repeat_ms``.
    """

    def __init__(self, target, tir_pipeline: str, *, remote: Remote | None = None,
                 cross_cc: str | None = None, repeat: int = 3, min_repeat_ms: int = 50):
        self.target, self.tir_pipeline = target, tir_pipeline
        self.remote, self.cross_cc = remote, cross_cc
        self.repeat, self.min_repeat_ms = repeat, min_repeat_ms
        self._session = None

    def __enter__(self) -> Timer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End the RPC session: the tracker lends a device to one session at a time (left open,
        the next session waited for its timeout)."""
        self._session = None
        gc.collect()

    def load(self, func: tirx.PrimFunc):
        """A callable ``() -> seconds`` timing ``func`` (scheduled) on fixed random arguments."""
        built = as_built(func)
        specs = param_specs(built)
        if specs is None:
            raise ValueError("a kernel with symbolic shapes cannot be timed alone")
        library = compile_kernel(built, self.target, self.tir_pipeline)
        kind = "cuda" if self.target.kind.name == "cuda" else "cpu"
        if self.remote is None:
            module, device = library.mod, tvm.device(kind, 0)
        else:
            if self._session is None:
                self._session = self.remote.session()
            path = SharedLibraryExport(self.cross_cc)(library.mod)
            self._session.upload(path)
            module = self._session.load_module(os.path.basename(path))
            device = self._session.device(kind, 0)
        args = random_args(specs, device)
        timer = module.time_evaluator("main", device, number=1, repeat=self.repeat,
                                      min_repeat_ms=self.min_repeat_ms)
        return lambda: float(statistics.median(timer(*args).results))

    def __call__(self, func: tirx.PrimFunc) -> float:
        """Seconds per call of ``func`` (scheduled)."""
        return self.load(func)()


def alternate(timings: Sequence, rounds: int) -> list[list[float]]:
    """Call each of ``timings`` (from :meth:`Timer.load`) ``rounds`` times, round-robin, so that
    a drift of the machine's speed falls on all alike; the seconds of each, in order."""
    seconds: list[list[float]] = [[] for _ in timings]
    for _ in range(rounds):
        for times, timing in zip(seconds, timings):
            times.append(timing())
    return seconds


def spread(seconds: Sequence[float]) -> float:
    """Half the range of ``seconds``: how far one timing of the kernel strays from another."""
    return (max(seconds) - min(seconds)) / 2


def beats(candidate: Sequence[float], baseline: Sequence[float]) -> bool:
    """Whether ``candidate``'s median is below ``baseline``'s by more than the spread of both
    (the larger of their half-ranges), in timings taken alternately (:func:`alternate`)."""
    gain = statistics.median(baseline) - statistics.median(candidate)
    return gain > max(spread(candidate), spread(baseline))
