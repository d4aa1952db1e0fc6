"""Time one model built with different CPU attention kernels, alternately in one process.

    git show 3f4bb6d~1:schedules/cpu/attention.py > /tmp/attention_before.py
    PYTHONPATH=/tmp python benchmarks/ab_attention.py whisper-encoder \
        15 attention_before -

Each argument after the rounds is a module with an ``attention_kernel(shape, lanes=...,
registers=..., cores=...)`` (a copy of ``schedules/cpu/attention.py`` with one change), ``-`` the
shipped one. As in ``ab_rules.py``: no tuning database, each round runs every build once in a
shuffled order, after an untimed run of the same build; prints each build's median and minimum.
"""

from __future__ import annotations

import importlib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import tvmfuse.strategy.cpu as cpu_strategy
from tvmfuse import api


def main() -> None:
    model_name, rounds, *variants = sys.argv[1:]
    target = api.get_target()
    model = api.import_model(model_name)
    shipped = cpu_strategy.attention_kernel
    runs = {}
    with tempfile.TemporaryDirectory() as folder:
        for i, variant in enumerate(variants):
            kernel = shipped if variant == "-" else importlib.import_module(
                variant).attention_kernel
            cpu_strategy.attention_kernel = kernel  # what CpuStrategy.attention_kernel hands out
            try:
                compiled = api.compile_model(model, target, api.BuildOptions(use_database=False))
            finally:
                cpu_strategy.attention_kernel = shipped
            deployed = api.load(api.build(compiled, Path(folder) / str(i)))
            runs[f"{i}: {variant}"] = deployed.runner(deployed.reference()[0])
        times = {name: [] for name in runs}
        order = list(runs)
        for _ in range(int(rounds)):
            random.shuffle(order)
            for name in order:
                runs[name]()  # untimed: the same build's caches and thread pool
                started = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - started)
    for name, seconds in times.items():
        print(f"{name}: median {statistics.median(seconds) * 1e3:.1f} ms, "
              f"min {min(seconds) * 1e3:.1f} ms ({rounds} rounds)")


if __name__ == "__main__":
    main()
