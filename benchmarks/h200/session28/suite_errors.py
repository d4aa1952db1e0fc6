"""The suite's small configs built for cuda-sm90 in fp16 and bf16, each run beside PyTorch eager in
the same precision on the GPU (tvmfuse bench's engines): both errors against PyTorch fp32, one
JSON line a build, for BENCHMARKS.md (tests/test_suite.py asserts the same on the GPU host).

    python3 benchmarks/h200/session28/suite_errors.py OUT.jsonl NAME [NAME ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tvmfuse import api
from tvmfuse.bench.session import bench


def main(out: str, *names: str) -> None:
    with Path(out).open("a") as lines:
        for name in names:
            model = api.import_model(f"benchmarks/suite/models.py:{name}_small")
            for dtype in ("float16", "bfloat16"):
                report = bench(model, api.get_target("cuda-sm90"), ["tvmfuse", "torch-eager"],
                               options=api.BuildOptions(use_database=False, dtype=dtype),
                               threads=1, repeat=5, max_seconds=5, peak=False, dtype=dtype)
                row = {"model": f"{name}_small", "dtype": dtype, **{
                    r.engine: {"rel_err": r.rel_err, "median_ms": r.median_ms,
                               "kernels": r.kernels} for r in report.results}}
                print(json.dumps(row), file=lines, flush=True)
                print(name, dtype, {e: v["rel_err"] for e, v in row.items()
                                    if isinstance(v, dict)}, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
