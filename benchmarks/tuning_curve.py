"""Latency against search trials: tvmfuse's tuning (hand-written schedules as the starting point)
against MetaSchedule from scratch, on the same kernels with the same trials.

    python benchmarks/tuning_curve.py resnet50 --top-k 4 --trials 8 --json curve.json

The kernels are the model's ``top-k`` by measured share of time (seed time x launches, from the
target's committed database). Each is searched twice with MetaSchedule's evolutionary search and
XGBoost cost model, ``trials`` candidates each, into two fresh databases: once with the seed record
in the database (where ``tvmfuse tune`` starts: the record the search has to beat; the search's
own population comes from MetaSchedule's design space either way, see ``search_task``), once from
nothing. A kernel's latency after
``n`` trials is the best measured so far; before any, its hand-written schedule (tvmfuse) or TVM's
default lowering (from scratch), both measured at the start of the run. The model's latency is
the sum over every kernel of its latency x launches (the other kernels at their seed time): what
the curve compares, trial by trial, with the trials of every searched kernel taken in step.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from tvm.s_tir import meta_schedule as ms

from tvmfuse import api, strategy
from tvmfuse.tuning import database
from tvmfuse.tuning.tune import Measure, hand_written, plan_tasks, search_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--trials", type=int, default=8, help="candidates per kernel per mode")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()

    target = api.get_target()
    tvm_target = target.tvm_target()
    seeds = ms.database.JSONDatabase(work_dir=str(api.default_database(target)))
    mod, _ = api.analyze(api.import_model(args.model), target, api.BuildOptions(use_database=False))
    tasks, plans = plan_tasks(mod, tvm_target, seeds)
    seed_records = {p.name: seeds.query_tuning_record(t.dispatched[0], tvm_target, p.name)
                    for t, p in zip(tasks, plans)}
    for plan in plans:
        plan.seconds = min(float(s) for s in seed_records[plan.name].run_secs)
    order = sorted(range(len(plans)), key=lambda i: -plans[i].share)[:args.top_k]
    # the searched kernels' starting points measured now, next to the search (this machine's
    # timings drift between runs; the database's seed times only order the kernels)
    measure, scheduler = Measure(), strategy.scheduler(target)
    kernels = []
    with tvm_target:
        for i in order:
            task, plan = tasks[i], plans[i]
            func = task.dispatched[0]["main"]
            kernels.append({"name": plan.name, "launches": plan.launches,
                            "seed_s": measure(hand_written(func, tvm_target, scheduler).mod["main"],
                                              tvm_target),
                            "default_s": measure(func, tvm_target), "runs": {}})
    for mode in ("tvmfuse", "scratch"):
        with tempfile.TemporaryDirectory(prefix=f"curve-{mode}-") as folder:
            db = ms.database.JSONDatabase(work_dir=folder)
            for kernel, i in zip(kernels, order):
                task = tasks[i]
                if mode == "tvmfuse":  # the seed record, as `tvmfuse tune` leaves it
                    db.commit_tuning_record(ms.database.TuningRecord(
                        seed_records[kernel["name"]].trace, db.commit_workload(task.dispatched[0]),
                        seed_records[kernel["name"]].run_secs, tvm_target,
                        ms.arg_info.ArgInfo.from_prim_func(task.dispatched[0]["main"])))
                known, start = len(database.read(Path(folder)).records), time.perf_counter()
                search_task(task, Path(folder) / f"search-{i}", db, args.trials)
                # the lines this search appended, in the order it measured them (the database
                # API returns records sorted by time); failed builds are 1e10 s
                records = database.read(Path(folder)).records[known:]
                kernel["runs"][mode] = [min(record[1][1]) for record in records]
                kernel.setdefault("search_s", {})[mode] = time.perf_counter() - start
                print(f"{mode} {kernel['name']}: {len(records)} records in "
                      f"{kernel['search_s'][mode]:.0f} s", flush=True)
    rest = sum(p.seconds * p.launches for i, p in enumerate(plans) if i not in order)
    curves = {mode: [_model_seconds(kernels, rest, mode, n) for n in range(args.trials + 1)]
              for mode in ("tvmfuse", "scratch")}
    report = {"model": args.model, "target": target.name, "trials_per_kernel": args.trials,
              "kernels": kernels, "other_kernels_s": rest, "model_s_by_trials": curves,
              "reaches_90pct_of_final_at": {m: _reach(c) for m, c in curves.items()}}
    args.json.write_text(json.dumps(report, indent=1))
    for n in range(args.trials + 1):
        print(f"{n:3d} trials/kernel: tvmfuse {curves['tvmfuse'][n] * 1e3:8.2f} ms   "
              f"scratch {curves['scratch'][n] * 1e3:9.2f} ms")


def _model_seconds(kernels: list[dict], rest: float, mode: str, trials: int) -> float:
    """Sum of kernel time x launches after ``trials`` candidates of each searched kernel."""
    total = rest
    for kernel in kernels:
        start = kernel["seed_s"] if mode == "tvmfuse" else kernel["default_s"]
        measured = [s for s in kernel["runs"][mode][:trials] if s < 1e9]  # 1e10: failed builds
        total += min([start, *measured]) * kernel["launches"]
    return total


def _reach(curve: list[float]) -> int:
    """The fewest trials per kernel after which the model is within 10% of its final latency
    (90% of the final speed)."""
    return next(n for n, seconds in enumerate(curve) if seconds <= curve[-1] / 0.9)


if __name__ == "__main__":
    main()
