"""Run a CUDA build once with every launch synchronous, printing each call of ``main`` before
it runs and its time after: the last name printed before a hang or a CUDA error is the kernel
that hung or faulted. On the GPU host:

    CUDA_LAUNCH_BLOCKING=1 python3 benchmarks/cuda_trace.py BUILD_DIR

(the inputs are the build's saved examples, ``check.npz``; ``timeout`` around it for a hang).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import tvm

from tvmfuse import api


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", help="a tvmfuse build folder for a CUDA target")
    folder = parser.parse_args().build
    deployed = api.load(folder)
    with np.load(f"{folder}/check.npz") as saved:
        arrays = [saved[k] for k in saved.files if k.startswith("input:")]
    args = [tvm.runtime.tensor(a, deployed.device) for a in arrays]
    started = [0.0]

    def instrument(_func, symbol, before, _ret, *call_args) -> None:
        if before:
            shapes = [tuple(a.shape) for a in call_args if hasattr(a, "shape")][:4]
            print(f"-> {symbol} {shapes}", flush=True)
            started[0] = time.perf_counter()
        else:
            deployed.device.sync()
            print(f"   {(time.perf_counter() - started[0]) * 1e3:.3f} ms", flush=True)

    deployed.vm.set_instrument(instrument)
    deployed.vm["main"](*args)
    deployed.device.sync()
    print("done")


if __name__ == "__main__":
    main()
