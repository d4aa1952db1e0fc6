"""How long ``tvmfuse build`` takes, cold and rebuilt unchanged, and where the time goes; results
for ``benchmarks/report.py`` in ``benchmarks/results/<machine-kind>/build-time.json``.

    python benchmarks/build_time.py [--models resnet50,bert-base] [--target T] [--dtype D]
        [--kind KIND] [--json OUT]

Each model is built twice with ``python -m tvmfuse build MODEL --no-db``, each time in a process
of its own: first with an empty kernel cache (``TVMFUSE_KERNEL_CACHE`` a new folder: cold), then
again unchanged with that cache into the same folder (rebuilt: tvmfuse keeps the folder, see
``tvmfuse/reuse.py``). A record holds the process's wall time (the interpreter's start included)
and the build's own seconds per stage from its manifest (``build_seconds``, or ``kept``'s for a
build that kept the folder; see ``tvmfuse/buildtime.py``). On the GPU host, from the project root:
``bash benchmarks/gpu.sh python3 benchmarks/build_time.py --target cuda-sm90 --dtype fp16
--kind h100 --json $OUT/build-time.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: The models the issue's numbers name: a conv net and a transformer encoder.
MODELS = "resnet50,bert-base"


def build(model: str, target: str | None, dtype: str, out_dir: Path, cache: Path) -> dict:
    """One ``tvmfuse build`` in its own process: its wall time and its manifest's seconds, or
    the last line of its error."""
    command = [sys.executable, "-m", "tvmfuse", "build", model, "--dtype", dtype, "--no-db",
               "-o", str(out_dir)]
    if target:
        command += ["--target", target]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "TVMFUSE_KERNEL_CACHE": str(cache)})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["(no output)"])[-1]}
    manifest = json.loads((out_dir / "manifest.json").read_text())
    if "kept" in manifest:  # the folder held this build already: this run's seconds
        return {"wall_s": round(wall, 2), "kept": True, **manifest["kept"]["build_seconds"]}
    return {"wall_s": round(wall, 2), **manifest["build_seconds"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=MODELS, help=f"comma-separated (default {MODELS})")
    parser.add_argument("--target", help="tvmfuse's target name (default: this CPU)")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--kind", help="machine kind the results are filed under")
    parser.add_argument("--json", type=Path,
                        help="default: benchmarks/results/<kind>/build-time.json")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "benchmarks"))
    from models import commit, machine_kind  # noqa: PLC0415 - loads TVM

    kind = args.kind or machine_kind()
    builds = []
    with tempfile.TemporaryDirectory(prefix="tvmfuse-build-time-") as scratch:
        for model in args.models.split(","):
            cache = Path(scratch) / f"{model}-kernels"
            for run in ("cold", "rebuilt"):
                record = build(model, args.target, args.dtype, Path(scratch) / model, cache)
                builds.append({"model": model, "run": run, **record})
                print(f"{model} {run}: " + (f"{record['wall_s']:.1f} s" if "wall_s" in record
                                           else record["error"]), flush=True)
    out = args.json or REPO / "benchmarks" / "results" / kind / "build-time.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "machine": kind, "commit": commit(), "commit_is": "measured",
        "reproduce": shlex.join(["python", "benchmarks/build_time.py", *sys.argv[1:]]),
        "target": args.target or "this CPU", "dtype": args.dtype, "cores": os.cpu_count(),
        "build_time": builds}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
