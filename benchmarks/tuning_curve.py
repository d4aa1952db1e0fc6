"""The model's latency against search trials and wall time: `tvmfuse tune`'s search of the rules'
design spaces against MetaSchedule's generic space, on the same kernels with the same trials.

    python benchmarks/tuning_curve.py resnet50 --top-k 4 --trials 32 \
        --json benchmarks/results/<kind>/tuning_curve-resnet50.json [--plot curve.png]

The kernels are the model's ``top-k`` by share of time (seed time x launches, timed here first).
Each is searched twice with MetaSchedule's evolutionary search and XGBoost cost model,
``trials`` candidates each, every candidate timed as the build runs it
(:class:`tvmfuse.tuning.measure.Timer`): over the design space of the rule that schedules it
(``tvmfuse``), and over MetaSchedule's generic space (``generic``). A kernel's latency after
``n`` trials is the best timed so far, or its hand-written schedule's where that is faster (the
build keeps the seed where nothing beats it). The model's latency is the sum over every kernel of
its latency x launches (the others at their seed time), trial by trial and second by second,
with the searched kernels taken in step. The search's timings are not the verified ones (``tvmfuse
tune`` re-times the winner against the seed before it records it): the curve shows where the
search goes, not what a build gains.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tvm.s_tir import meta_schedule as ms

from tvmfuse import api, strategy
from tvmfuse.passes.apply_database import hand_written
from tvmfuse.tuning.measure import Timer
from tvmfuse.tuning.search import search_task
from tvmfuse.tuning.tune import plan_tasks

MODES = ("tvmfuse", "generic")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--trials", type=int, default=32, help="candidates per kernel per mode")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--plot", type=Path, help="also draw the curves into this PNG")
    args = parser.parse_args()

    target = api.get_target()
    tvm_target = target.tvm_target()
    scheduler = strategy.scheduler(target)
    mod, _ = api.analyze(api.import_model(args.model), target, api.BuildOptions(use_database=False))
    with tvm_target, Timer(tvm_target, strategy.for_target(target).tir_pipeline()) as timer:
        tasks, plans = plan_tasks(mod, tvm_target, ms.database.MemoryDatabase())
        for task, plan in zip(tasks, plans):
            seed = hand_written(task.dispatched[0]["main"], tvm_target, scheduler)
            plan.seconds = timer(seed.mod["main"]) if seed is not None else 0.0
        order = sorted(range(len(plans)), key=lambda i: -plans[i].share)[:args.top_k]
        kernels = [{"name": plans[i].name, "launches": plans[i].launches,
                    "seed_s": plans[i].seconds, "runs": {}} for i in order]
        for mode in MODES:
            with tempfile.TemporaryDirectory(prefix=f"curve-{mode}-") as folder:
                for kernel, i in zip(kernels, order):
                    found = search_task(tasks[i], tvm_target, scheduler, timer,
                                        Path(folder) / str(i), args.trials,
                                        generic=mode == "generic")
                    found.sort(key=lambda c: c.found_after_s)  # in the order they were timed
                    kernel["runs"][mode] = [[c.found_after_s, c.seconds] for c in found]
                    print(f"{mode} {kernel['name']}: {len(found)} candidates ran, best "
                          f"{min((c.seconds for c in found), default=0) * 1e3:.3f} ms "
                          f"(seed {kernel['seed_s'] * 1e3:.3f} ms)", flush=True)
    rest = sum(p.seconds * p.launches for i, p in enumerate(plans) if i not in order)
    curves = {mode: [_model_seconds(kernels, rest, mode, n) for n in range(args.trials + 1)]
              for mode in MODES}
    report = {"model": args.model, "target": target.name, "trials_per_kernel": args.trials,
              "kernels": kernels, "other_kernels_s": rest, "model_s_by_trials": curves,
              "seed_model_s": curves["tvmfuse"][0],
              "command": f"python benchmarks/tuning_curve.py {args.model} --top-k {args.top_k} "
                         f"--trials {args.trials}"}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    for n in range(args.trials + 1):
        print(f"{n:3d} trials/kernel: " + "   ".join(
            f"{mode} {curves[mode][n] * 1e3:8.2f} ms" for mode in MODES))
    if args.plot is not None:
        _plot(kernels, rest, curves, args.plot)


def _model_seconds(kernels: list[dict], rest: float, mode: str, trials: int) -> float:
    """Sum of kernel time x launches after ``trials`` candidates of each searched kernel."""
    return rest + sum(min([k["seed_s"], *(s for _, s in k["runs"][mode][:trials])]) * k["launches"]
                      for k in kernels)


def _plot(kernels: list[dict], rest: float, curves: dict, path: Path) -> None:
    import matplotlib  # noqa: PLC0415 - the bench extra

    matplotlib.use("Agg")
    from matplotlib import pyplot  # noqa: PLC0415

    figure, (by_trials, by_time) = pyplot.subplots(1, 2, figsize=(10, 4))
    for mode in MODES:
        by_trials.plot([c * 1e3 for c in curves[mode]], label=mode)
        # wall time: the kernels searched one after another, each its own search's seconds
        offset, points = 0.0, []
        current = {k["name"]: k["seed_s"] for k in kernels}
        for kernel in kernels:
            for after, seconds in kernel["runs"][mode]:
                current[kernel["name"]] = min(current[kernel["name"]], seconds)
                total = rest + sum(current[k["name"]] * k["launches"] for k in kernels)
                points.append((offset + after, total * 1e3))
            offset += kernel["runs"][mode][-1][0] if kernel["runs"][mode] else 0.0
        by_time.plot([p[0] for p in points], [p[1] for p in points], label=mode)
    by_trials.set(xlabel="trials per kernel", ylabel="model latency (ms, sum of kernels)")
    by_time.set(xlabel="search wall time (s)", ylabel="model latency (ms, sum of kernels)")
    by_trials.legend()
    figure.tight_layout()
    figure.savefig(path)


if __name__ == "__main__":
    main()
