"""What `tvmfuse tune` gains on whole models: each model tuned into a fresh database within a
budget, then benched side by side: the tuned build, the untuned build and ONNX Runtime.

    OPENBLAS_NUM_THREADS=1 python benchmarks/tune_gain.py resnet50 mobilenet_v2 bert-base \
        --budget 30m --top-k 10 [--json benchmarks/results/<kind>/tune-gain.json]

For each model: ``tvmfuse tune MODEL --budget B --top-k K`` into a fresh database (the kernels'
verdicts: each searched kernel's schedule and best searched time, re-timed alternately, and
whether the searched one was recorded), then ``tvmfuse bench MODEL --db DB --engines
tvmfuse,tvmfuse-untuned,onnxruntime`` (interleaved rounds, medians). The JSON goes to
``benchmarks/results/<kind>/tune-gain.json`` for ``benchmarks/report.py``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from models import REPO, commit, machine_kind

from tvmfuse import api

ENGINES = "tvmfuse,tvmfuse-untuned,onnxruntime"


def tune_and_bench(name: str, budget: str, top_k: int, repeat: int, scratch: Path) -> dict:
    """Tune ``name`` into a fresh database under ``scratch``, then bench it; one JSON value."""
    from tvmfuse.cli.tune import BUDGET_TRIALS, _duration  # noqa: PLC0415 - the CLI's own

    database = scratch / name / "db"
    started = time.perf_counter()
    target = api.get_target()
    _, plans = api.tune(api.import_model(name), target, api.BuildOptions(database=database),
                        trials=BUDGET_TRIALS, top_k=top_k, budget_s=_duration(budget),
                        progress=False)
    tune_s = time.perf_counter() - started
    out = scratch / name / "bench.json"
    command = [sys.executable, "-m", "tvmfuse", "bench", name, "--db", str(database),
               "--engines", ENGINES, "--repeat", str(repeat), "--json", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    result = {"model": name, "tune_s": round(tune_s, 1),
              "kernels": [{"name": p.name, "launches": p.launches, "trials": p.trials,
                           "schedule_ms": p.verified_ms, "searched_ms": p.searched_ms,
                           "recorded": p.accepted} for p in plans if p.trials]}
    if done.returncode != 0:
        result["error"] = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    else:
        result["bench"] = json.loads(out.read_text())
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", metavar="NAME", help="zoo names")
    parser.add_argument("--budget", default="30m", help="tuning budget per model (30m)")
    parser.add_argument("--top-k", type=int, default=10, help="kernels searched per model (10)")
    parser.add_argument("--repeat", type=int, default=20, help="bench rounds (20)")
    parser.add_argument("--kind", help="machine kind the results are filed under")
    parser.add_argument("--json", type=Path,
                        help="default: benchmarks/results/<kind>/tune-gain.json")
    args = parser.parse_args()
    kind = args.kind or machine_kind()
    out = args.json or REPO / "benchmarks" / "results" / kind / "tune-gain.json"
    reproduce = shlex.join(["OPENBLAS_NUM_THREADS=1", "python", "benchmarks/tune_gain.py",
                            *args.names, "--budget", args.budget, "--top-k", str(args.top_k),
                            "--repeat", str(args.repeat)])
    runs = []

    def write() -> None:  # after every model: a run that dies later keeps the models done
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"machine": kind, "commit": commit(), "commit_is": "measured",
                                   "reproduce": reproduce, "tune_gain": runs}, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="tvmfuse-tune-gain-") as scratch:
        for name in args.names:
            print(f"tuning {name} for {args.budget} ...", flush=True)
            runs.append(tune_and_bench(name, args.budget, args.top_k, args.repeat, Path(scratch)))
            run = runs[-1]
            recorded = sum(k["recorded"] for k in run["kernels"])
            print(f"  {recorded} of {len(run['kernels'])} searched kernels recorded; " + (
                run["error"] if "error" in run else ", ".join(
                    f"{r['engine']} {r['median_ms']:.2f} ms" for r in run["bench"]["results"]
                    if r.get("median_ms") is not None)), flush=True)
            write()
    print(f"wrote {out}; `python benchmarks/report.py` puts it into BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
