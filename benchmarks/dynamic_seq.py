"""One ``--dynamic seq`` build against a build per length: DistilBERT (full size, fp32, batch 1,
untuned) built once with ``--dynamic seq --max-seq 512`` and once per length with that length
fixed, each timed by ``tvmfuse bench`` next to ONNX Runtime (exported at that length) in one run
per length and build. Every run's report goes into one JSON (``runs``), the file
``benchmarks/report.py`` reads once the machine, commit and command are added to it; the table is
printed at the end.

    python benchmarks/dynamic_seq.py [--model SOURCE] [--lengths 50,128,384] [--max-seq 512]
                                     [--repeat N] --json benchmarks/results/KIND/dynamic-seq.json

What it shows: what a symbolic length costs (kernels scheduled without knowing it: padded rows,
a fixed query tile, the mask built per call) against kernels fitted to each length.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def bench(model: str, length: int, dynamic: bool, max_seq: int, repeat: int, work: Path) -> dict:
    name = f"{model.rpartition(':')[2]}-{length}-{'dynamic' if dynamic else 'static'}"
    out = work / f"{name}.json"
    command = [sys.executable, "-m", "tvmfuse", "bench", model, "--no-db",
               "--engines", "tvmfuse,onnxruntime", "--repeat", str(repeat), "--json", str(out),
               "--input-shape", f"1,{length}:int64", "--input-shape", f"1,{length}:int64"]
    if dynamic:
        command += ["--dynamic", "seq", "--max-seq", str(max_seq)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["(no output)"])[-1]}
    return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="distilbert")
    parser.add_argument("--lengths", default="50,128,384")
    parser.add_argument("--max-seq", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json", type=Path, required=True, help="where to write every run")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dynamic-seq-"))
    rows, runs = [], []
    for length in (int(n) for n in args.lengths.split(",")):
        times = {}
        for dynamic in (False, True):
            print(f"benching seq {length}, {'dynamic' if dynamic else 'static'} ...", flush=True)
            report = bench(args.model, length, dynamic, args.max_seq, args.repeat, work)
            if "error" in report:
                print(f"  failed: {report['error']}", flush=True)
                continue
            runs.append(report)
            by = {r["engine"]: r for r in report["results"]}
            times[dynamic] = (by["tvmfuse"]["median_ms"], by["tvmfuse"]["kernels"],
                              by.get("onnxruntime", {}).get("median_ms"))
        static, dynamic = times.get(False), times.get(True)

        def cell(entry, index, digits=2):
            return "-" if entry is None or entry[index] is None else f"{entry[index]:.{digits}f}"

        ratio = (f"{dynamic[0] / static[0]:.2f}x" if static and dynamic else "-")
        vs_ort = (f"{dynamic[0] / dynamic[2]:.2f}x" if dynamic and dynamic[2] else "-")
        rows.append(f"| {length} | {cell(static, 0)} ({cell(static, 1, 0)}) | "
                    f"{cell(dynamic, 0)} ({cell(dynamic, 1, 0)}) | {ratio} | "
                    f"{cell(dynamic, 2)} | {vs_ort} |")
        print(rows[-1], flush=True)
    print(f"\n{platform.node()}: {args.model}, fp32, batch 1, --no-db, medians of {args.repeat}; "
          f"dynamic: one build, --max-seq {args.max_seq}\n")
    print("| seq | static build ms (kernels) | dynamic build ms (kernels) | dynamic / static "
          "| ONNX Runtime ms | dynamic vs ORT |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    args.json.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
