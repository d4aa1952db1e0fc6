"""Latency measurement: the timing loop every tvmfuse timing goes through.

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
from dataclasses import dataclass

MIN_RUNS = 3


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


def time_deployed(deployed, arrays, repeat: int) -> Latency:
    """``repeat`` timed runs of a loaded build (:class:`tvmfuse.runtime.Deployed`) on
    ``arrays`` after a warm-up: by this machine's clock here, by the device's own over RPC."""
    if deployed.rpc is None:
        (latency,) = measure({"tvmfuse": deployed.runner(arrays)}, repeat=repeat)
        return latency
    return Latency("tvmfuse", tuple(1e3 * t for t in deployed.remote_times(arrays, repeat)))
