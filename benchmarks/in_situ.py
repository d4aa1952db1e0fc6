"""Time each kernel of a build where the model runs it (inside ``main``, after the kernels before
it) and alone (``time_evaluator`` on the same arguments, warm, and cold after a cache flush):
where the two differ, a kernel's cost in the model is not its cost in ``tvmfuse inspect
--profile``, which times kernels alone.

    python benchmarks/in_situ.py BUILD_DIR [--runs N] [--top K]

BUILD_DIR is a ``tvmfuse build`` folder (its ``model.so``), run on this CPU on seeded random
inputs (its manifest's input specs). The in-situ times come from the Relax VM's instrument hook,
called before and after every packed call (a few microseconds of Python each, counted in).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

#: Bytes written between cold calls: more than any CPU's last-level cache this project runs on.
FLUSH_BYTES = 256 << 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", type=Path, help="a tvmfuse build folder")
    parser.add_argument("--runs", type=int, default=30, help="instrumented runs of main")
    parser.add_argument("--top", type=int, default=10, help="kernels shown, slowest in situ first")
    args = parser.parse_args()

    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    from tvmfuse.runtime import load  # noqa: PLC0415
    from tvmfuse.specs import random_inputs  # noqa: PLC0415

    deployed = load(args.build)
    library = tvm.runtime.load_module(str(args.build / "model.so"))
    device = tvm.cpu()
    vm = relax.VirtualMachine(library, device)
    inputs = [tvm.runtime.tensor(a, device) for a in random_inputs(deployed.inputs)]
    for _ in range(10):
        vm["main"](*inputs)
    whole = []
    for _ in range(args.runs):
        start = time.perf_counter()
        vm["main"](*inputs)
        whole.append(time.perf_counter() - start)

    seconds: dict[str, list[float]] = collections.defaultdict(list)
    started: dict[str, float] = {}
    arguments: dict[str, list] = {}

    def instrument(_func, name, before, _ret, *call_args):
        now = time.perf_counter()
        if before:
            started[name] = now
            arguments.setdefault(name, list(call_args))
        else:
            seconds[name].append(now - started[name])
        return 0

    vm.set_instrument(instrument)
    for _ in range(args.runs):
        vm["main"](*inputs)
    vm.set_instrument(lambda *_: 0)

    modules = [library]
    for module in modules:
        modules.extend(module.imports)
    per_run = {name: statistics.median(times) * len(times) / args.runs
               for name, times in seconds.items()}
    print(f"main: median {statistics.median(whole) * 1e3:.3f} ms; its calls in situ add up to "
          f"{sum(per_run.values()) * 1e3:.3f} ms")
    print(f"{'a run ms':>9} {'calls':>5} {'in situ':>8} {'alone':>7} {'cold':>7}  kernel "
          f"(ms a call: median in situ; alone warm; alone after a cache flush)")
    for name, in_situ in sorted(per_run.items(), key=lambda kv: -kv[1])[:args.top]:
        calls = len(seconds[name]) // args.runs
        call = statistics.median(seconds[name])
        owner = next((m for m in modules if m.implements_function(name)), None)
        if owner is None:  # a VM builtin (allocation, shape bookkeeping)
            print(f"{in_situ * 1e3:9.3f} {calls:5d} {call * 1e3:8.3f} {'-':>7} {'-':>7}  {name}")
            continue
        # (alone: the arguments of the first call; a kernel called with several shapes is timed
        # on that one)
        warm = owner.time_evaluator(name, device, number=10, repeat=5)(*arguments[name])
        cold = owner.time_evaluator(name, device, number=1, repeat=20,
                                    cache_flush_bytes=FLUSH_BYTES)(*arguments[name])
        print(f"{in_situ * 1e3:9.3f} {calls:5d} {call * 1e3:8.3f} {warm.median * 1e3:7.3f} "
              f"{cold.median * 1e3:7.3f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
