"""Latency measurement and the `tvmfuse bench` report.

Engines run in interleaved rounds (A B C A B C ...) so that drift on a noisy machine hits all of
them alike. Each engine is warmed up first; a slow engine stops after ``max_seconds`` of timed
runs (but never before three runs, nor after ``repeat``); the others go on to ``repeat``.

Within a round each engine runs once untimed right before its timed run: thread pools (OpenMP's,
ONNX Runtime's, TVM's) keep spinning for a while after a run, and the next engine would pay for
it on the same two cores (measured: tvmfuse's MobileNetV2 took 14.7 ms right after PyTorch eager
runs, 6.2 ms alone).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MIN_RUNS = 3

#: Every engine `tvmfuse bench` knows, in the order it prepares them (see tvmfuse.engines).
ENGINES = ("tvmfuse", "tvmfuse-unfused", "stock-tvm", "torch-eager", "torch-compile",
           "torch-compile-freezing", "onnxruntime")
#: tvmfuse's own engines: not peers (``tvmfuse-unfused`` is tvmfuse with its fusion rules off,
#: the same layouts and schedules: what fusion alone is worth).
OWN = ("tvmfuse", "tvmfuse-unfused")


@dataclass(frozen=True)
class Latency:
    engine: str
    times_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)

    @property
    def max_ms(self) -> float:
        return max(self.times_ms)


def wall_clock_ms(run: Callable[[], object]) -> float:
    """Milliseconds of one blocking run, by the host's clock."""
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) * 1e3


def cuda_event_timer() -> Callable[[Callable[[], object]], float]:
    """Time one run with CUDA events on the default stream, which both PyTorch and TVM launch on:
    the GPU's own clock, without the host's launch and synchronisation overheads at the ends."""
    import torch  # noqa: PLC0415

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def time_ms(run: Callable[[], object]) -> float:
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    return time_ms


def measure(engines: dict[str, Callable[[], object]], *, repeat: int, warmup: int = 1,
            max_seconds: float = math.inf,
            timer: Callable[[Callable[[], object]], float] = wall_clock_ms) -> list[Latency]:
    """Time each zero-argument blocking callable in interleaved rounds, each run by ``timer``
    (milliseconds); see the module doc."""
    settle = len(engines) > 1
    runs = {}
    for name, run in engines.items():
        start = time.perf_counter()
        for _ in range(warmup):
            run()
        per_run = (time.perf_counter() - start) / max(warmup, 1)
        per_run *= 2 if settle else 1
        affordable = max_seconds / per_run if per_run > 0 else math.inf
        runs[name] = repeat if affordable >= repeat else min(repeat, max(MIN_RUNS, int(affordable)))
    times: dict[str, list[float]] = {name: [] for name in engines}
    for round_ in range(max(runs.values())):
        for name, run in engines.items():
            if round_ < runs[name]:
                if settle:
                    run()
                times[name].append(timer(run))
    return [Latency(name, tuple(t)) for name, t in times.items()]


@dataclass
class Result:
    """One engine's line in the report (the JSON schema of ``results``)."""

    engine: str
    median_ms: float
    min_ms: float
    max_ms: float
    runs: int
    setup_s: float
    rel_err: float | None
    kernels: int | None
    ratio_to_best_peer: float | None = None
    gflops: float | None = None
    fraction_of_peak: float | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Report:
    model: str
    target: str
    threads: int
    batch: int | None
    dtype: str
    flops: float | None
    peak_gflops: float | None
    results: list[Result] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    command: str = ""
    #: How runs were timed: "wall-clock" (host) or "cuda-events" (the GPU's clock).
    timer: str = "wall-clock"

    def finish(self) -> None:
        """Fill in the ratios to the best peer (every engine but tvmfuse's own) and GFLOP/s."""
        peers = [r.median_ms for r in self.results if r.engine not in OWN]
        best = min(peers) if peers else None
        for r in self.results:
            r.ratio_to_best_peer = r.median_ms / best if best else None
            if self.flops:
                r.gflops = self.flops / r.median_ms / 1e6
                if self.peak_gflops:
                    r.fraction_of_peak = r.gflops / self.peak_gflops

    def to_json(self) -> dict:
        data = {k: v for k, v in self.__dict__.items() if k != "results"}
        data["results"] = [r.to_json() for r in self.results]
        return data


def measure_peak_gflops(target, threads: int) -> float:
    """The target's practical fp32 peak here, in GFLOP/s.

    CPUs: a kernel of nothing but FMAs, generated for ``target`` (``target.vector``): each
    thread keeps 16 independent vector accumulators (enough chains to hide the FMA latency on
    both pipes) through a long loop; 545 GFLOP/s on this 2-core Zen 5 (272 a core: 2 AVX-512
    FMA pipes at about 4.25 GHz). PyTorch's large sgemm, the measure before, ran at 220 here,
    below what tvmfuse's and ONNX Runtime's convs reach. CUDA: the best of 10 strict fp32
    (no TF32) PyTorch sgemms of 8192^3.
    """
    if target.device == "cuda":
        return _cuda_sgemm_gflops(8192)
    return _fma_loop_gflops(target, threads)


def _fma_loop_gflops(target, threads: int, chains: int = 16, steps: int = 200_000) -> float:
    import tvm  # noqa: PLC0415

    library, args = fma_loop(target, threads, chains, steps)
    seconds = min(library.time_evaluator("main", tvm.cpu(), number=3, repeat=5)(*args).results)
    lanes = args[0].shape[-1]
    return 2 * threads * chains * lanes * steps / seconds / 1e9


def fma_loop(target, threads: int, chains: int = 16, steps: int = 200_000):
    """The FMA-only kernel :func:`measure_peak_gflops` times, built for ``target``: the library
    and its arguments (``b``, then the accumulators written at the end)."""
    import numpy as np  # noqa: PLC0415
    import tvm  # noqa: PLC0415
    from tvm import s_tir, te, tirx  # noqa: PLC0415

    lanes = target.vector.lanes if target.vector is not None else 1
    # acc = acc * 0.999 + b, a reduction TE can express: one FMA per step
    decay = te.comm_reducer(lambda acc, b: acc * tirx.const(0.999, "float32") + b,
                            lambda dtype: tirx.const(0.0, dtype), name="decay")
    b = te.placeholder((threads, chains, lanes), name="b")
    step = te.reduce_axis((0, steps), name="step")
    acc = te.compute((threads, chains, lanes), lambda t, c, v: decay(b[t, c, v], axis=step),
                     name="acc")
    sch = s_tir.Schedule(te.create_prim_func([b, acc]))
    block = sch.get_sblock("acc")
    registers = sch.cache_write(block, 0, "local")
    thread, chain, lane, reduction = sch.get_loops(block)
    sch.reorder(thread, reduction, chain, lane)
    sch.parallel(thread)
    sch.unroll(chain)
    sch.vectorize(lane)
    sch.reverse_compute_at(registers, thread)
    sch.decompose_reduction(block, reduction)
    library = tvm.compile(sch.mod, target=target.tvm_target())
    device = tvm.cpu()
    args = [tvm.runtime.tensor(np.full((threads, chains, lanes), 1e-3, "float32"), device),
            tvm.runtime.tensor(np.zeros((threads, chains, lanes), "float32"), device)]
    return getattr(library, "mod", library), args


def _cuda_sgemm_gflops(size: int, repeat: int = 10) -> float:
    import torch  # noqa: PLC0415

    a, b = torch.randn(size, size, device="cuda"), torch.randn(size, size, device="cuda")
    torch.mm(a, b)  # TF32 is off: tvmfuse.api.bench turns it off for CUDA runs
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        torch.mm(a, b)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9
