"""Time one zoo model built with different fusion rules files, alternately in one process.

    python benchmarks/ab_rules.py bert-base 30 - benchmarks/layer-norm-epilogue-off.toml -

``-`` is the shipped rules. Every build applies no tuning database (the hand-written schedules);
each round runs every build once, in a shuffled order, so that drift in this machine's speed
falls on all of them alike. Prints each build's median and minimum in milliseconds.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tvmfuse import api


def main() -> None:
    model_name, rounds, *rules_files = sys.argv[1:]
    target = api.get_target()
    model = api.import_model(model_name)
    runs = {}
    with tempfile.TemporaryDirectory() as folder:
        for i, rules in enumerate(rules_files):
            options = api.BuildOptions(use_database=False,
                                       fusion_rules=None if rules == "-" else Path(rules))
            deployed = api.load(api.build(api.compile_model(model, target, options),
                                          Path(folder) / str(i)))
            runs[f"{i}: {rules}"] = deployed.runner(deployed.reference()[0])
        times = {name: [] for name in runs}
        for run in runs.values():
            run()  # warm-up
        order = list(runs)
        for _ in range(int(rounds)):
            random.shuffle(order)
            for name in order:
                start = time.perf_counter()
                runs[name]()
                times[name].append((time.perf_counter() - start) * 1e3)
    for name, ms in times.items():
        print(f"{name}: median {statistics.median(ms):.2f} ms, min {min(ms):.2f}")


if __name__ == "__main__":
    main()
