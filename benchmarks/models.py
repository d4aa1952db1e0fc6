"""Bench whole models as a user would: one `tvmfuse bench` run per zoo name, fp32, batch 1,
untuned (``--no-db``), tvmfuse next to its peers, and one JSON of all the runs for
``benchmarks/report.py``: ``benchmarks/results/<machine-kind>/<set>.json``.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/models.py [--set suite|unseen|popular]
        [NAME ...] [--engines LIST] [--repeat N] [--kind KIND] [--json OUT]

``--set suite`` (the default) runs the suite's fourteen `transformers` architectures, ``--set
unseen`` the eight architectures no schedule was fitted to, ``--set popular`` the coverage sweep's
twenty most downloaded architectures at their published sizes (``tvmfuse.zoo.POPULAR``); names
given run instead. A model whose bench fails is kept in the JSON with its error (``tvmfuse
bench``'s last line) and the others still run. The machine kind is the host CPU's (zen3, zen4,
zen5, emeraldrapids, ...; ``--kind`` overrides it).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from report import commit

from tvmfuse import targets, zoo

REPO = Path(__file__).resolve().parent.parent
#: LLVM's name of a host core -> the machine kind its results are filed under.
KINDS = {"znver3": "zen3", "znver4": "zen4", "znver5": "zen5"}
#: What each set runs by default: its zoo names, engines and rounds.
SETS = {
    "suite": (tuple(zoo.SUITE), "tvmfuse,onnxruntime,torch-compile", 10),
    "unseen": (tuple(zoo.UNSEEN), "tvmfuse,onnxruntime", 7),
    # the coverage sweep's twenty most downloaded architectures, in its order: the zoo's and
    # the suite's where it holds them, the rest from zoo.POPULAR
    "popular": (("bert-base", "roberta", "distilbert", "gpt2", "llama", "mistral", "qwen2", "t5",
                 "bart", "vit", "deit", "swin", "convnext", "resnet50", "clip-vision",
                 "whisper-encoder", "wav2vec2", "deberta-v2", "segformer", "dpt"),
                "tvmfuse,onnxruntime", 7),
}


def machine_kind() -> str:
    """The host's machine kind: its LLVM core name, shortened for the AMD cores."""
    target = targets.get_target()
    core = target.config.get("mcpu", target.name)
    return KINDS.get(core, core)


def bench(name: str, engines: str, repeat: int, scratch: Path) -> dict:
    """``tvmfuse bench`` of one zoo name in its own process: its JSON, or its error."""
    out = scratch / f"{name}.json"
    command = [sys.executable, "-m", "tvmfuse", "bench", name, "--no-db", "--engines", engines,
               "--repeat", str(repeat), "--json", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        error = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"model": name, "error": error}
    return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="zoo names (default: the set's; `tvmfuse build --list`)")
    parser.add_argument("--set", choices=SETS, default="suite")
    parser.add_argument("--engines", help="default: the set's")
    parser.add_argument("--repeat", type=int, help="default: the set's")
    parser.add_argument("--kind", help="machine kind the results are filed under")
    parser.add_argument("--json", type=Path,
                        help="default: benchmarks/results/<kind>/<set>.json")
    args = parser.parse_args()
    names, engines, repeat = SETS[args.set]
    names, engines, repeat = args.names or names, args.engines or engines, args.repeat or repeat
    unknown = [name for name in names if name not in zoo.registry()]
    if unknown:
        parser.error(f"not a zoo name: {', '.join(unknown)} (see `tvmfuse build --list`)")
    kind = args.kind or machine_kind()
    out = args.json or REPO / "benchmarks" / "results" / kind / f"{args.set}.json"
    reproduce = shlex.join(["OPENBLAS_NUM_THREADS=1", "python", "benchmarks/models.py",
                            "--set", args.set, *args.names, "--engines", engines,
                            "--repeat", str(repeat)])
    runs = []
    with tempfile.TemporaryDirectory(prefix="tvmfuse-models-") as scratch:
        for name in names:
            print(f"benching {name} ...", flush=True)
            runs.append(bench(name, engines, repeat, Path(scratch)))
            result = runs[-1]
            print(f"  {result['error']}" if "error" in result else "  " + ", ".join(
                f"{r['engine']} {r['median_ms']:.2f} ms" for r in result["results"]
                if r.get("median_ms") is not None), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": kind, "commit": commit(), "commit_is": "measured",
                               "reproduce": reproduce, "runs": runs}, indent=1) + "\n")
    print(f"wrote {out}; `python benchmarks/report.py` puts it into BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
