"""Latency measurement: engines timed in interleaved rounds (A B A B ...) so drift hits all alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


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

    def to_json(self) -> dict:
        return {"engine": self.engine, "median_ms": self.median_ms, "min_ms": self.min_ms,
                "max_ms": self.max_ms, "runs": len(self.times_ms)}


def measure(engines: dict[str, Callable[[], object]], *, repeat: int, warmup: int = 1) -> list[Latency]:
    """Time each zero-argument callable ``repeat`` times, one call per engine per round.

    Each callable must block until its result is ready.
    """
    for run in engines.values():
        for _ in range(warmup):
            run()
    times: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(repeat):
        for name, run in engines.items():
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) * 1e3)
    return [Latency(name, tuple(t)) for name, t in times.items()]
