"""Bench whole models as a user would: one `tvmfuse bench` run per zoo name (by default the
suite's fourteen architectures at full size), fp32, batch 1, tvmfuse next to ONNX Runtime and
torch.compile, untuned (``--no-db``: none of these kernels has a tuning record). Each run's JSON
goes to ``benchmarks/suite/results/<name>.json``; the table for BENCHMARKS.md is printed at the
end.

    .venv/bin/python benchmarks/models.py [NAME ...] [--engines LIST] [--repeat N]

A model whose bench fails is reported with its error and the others still run.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from tvmfuse import zoo

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "suite" / "results"


def bench(name: str, engines: str, repeat: int) -> dict:
    out = RESULTS / f"{name}.json"
    command = [sys.executable, "-m", "tvmfuse", "bench", name, "--no-db", "--engines", engines,
               "--repeat", str(repeat), "--json", str(out)]
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        error = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"model": name, "error": error, "seconds": round(time.monotonic() - started)}
    return json.loads(out.read_text())


def row(name: str, report: dict) -> str:
    if "error" in report:
        return f"| {name} | - | - | - | - | - | {report['error']} |"
    by = {r["engine"]: r for r in report["results"]}
    ours = by.get("tvmfuse")
    ort, compiled = by.get("onnxruntime"), by.get("torch-compile")

    def ms(r):
        return f"{r['median_ms']:.2f}" if r else "-"

    def ratio(r):
        return f"{ours['median_ms'] / r['median_ms']:.2f}x" if r and ours else "-"

    kernels = ours["kernels"] if ours else "-"
    err = f"{ours['rel_err']:.1e}" if ours and ours["rel_err"] is not None else "-"
    return (f"| {name} | {kernels} | {ms(ours)} | {ms(ort)} | {ratio(ort)} | {ms(compiled)} "
            f"| {ratio(compiled)} | {err} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", default=list(zoo.SUITE), metavar="NAME",
                        help="zoo names (default: the suite's fourteen; `tvmfuse build --list`)")
    parser.add_argument("--engines", default="tvmfuse,onnxruntime,torch-compile")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    unknown = [name for name in args.names if name not in zoo.registry()]
    if unknown:
        parser.error(f"not a zoo name: {', '.join(unknown)} (see `tvmfuse build --list`)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.names:
        print(f"benching {name} ...", flush=True)
        rows.append(row(name, bench(name, args.engines, args.repeat)))
        print(rows[-1], flush=True)
    print(f"\n{platform.node()}: tvmfuse bench, fp32, batch 1, --no-db, medians of "
          f"{args.repeat}\n")
    print("| model | kernels | tvmfuse ms | ONNX Runtime ms | vs ORT | torch.compile ms "
          "| vs torch.compile | rel err |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
