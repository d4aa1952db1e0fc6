"""What a parallel loop costs before any work: TVM's thread pool starting and joining an empty
two-iteration ``T.parallel`` loop, beside the same loop serial (both compiled for this CPU).

    .venv/bin/python benchmarks/fork_join.py [--threads 2]

A 197 x 77 LayerNorm's whole budget under #18's sweep line is 1.6-1.8 us on 2 Zen 4 cores (70%
of the family's best, which moves between runs); this is the part of it a second thread costs
first (0.83 us there). Times are ``time_evaluator``'s (200 calls a repeat),
best and median of 7 alternating rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", default="2")
args = parser.parse_args()
os.environ["TVM_NUM_THREADS"] = args.threads
os.environ.setdefault("TVM_BIND_THREADS", "0")

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm.script import tirx as T  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tvmfuse.targets import get_target  # noqa: E402


@T.prim_func
def parallel(a: T.Buffer((64,), "float32")):
    for i in T.parallel(2):
        a[i * 32] = a[i * 32] + T.float32(1)  # a cache line apart: no false sharing


@T.prim_func
def serial(a: T.Buffer((64,), "float32")):
    for i in T.serial(2):
        a[i * 32] = a[i * 32] + T.float32(1)


def main() -> int:
    target = get_target().tvm_target()
    libraries = {name: tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                                   target=target).mod
                 for name, func in (("parallel", parallel), ("serial", serial))}
    data = tvm.runtime.tensor(np.zeros(64, "float32"))
    seconds = {name: [] for name in libraries}
    for _ in range(7):
        for name, library in libraries.items():
            timer = library.time_evaluator("main", tvm.cpu(), number=200, repeat=5)
            seconds[name].append(min(timer(data).results))
    for name, times in seconds.items():
        print(f"{name:8s} best {min(times) * 1e6:.3f} us, "
              f"median {statistics.median(times) * 1e6:.3f} us ({args.threads} threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
