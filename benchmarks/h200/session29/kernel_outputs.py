"""Where a GPU build's numbers part from the CPU build's: every kernel launch's arguments after it
ran (inputs and outputs), recorded on each machine, then compared launch by launch.

    # on the GPU host, and here (the same model, precision and seed)
    python3 benchmarks/h200/session29/kernel_outputs.py record \
        benchmarks/suite/models.py:llama_prefill_small float16 cuda-sm90 $OUT/gpu.npz
    .venv/bin/python benchmarks/h200/session29/kernel_outputs.py record ... float16 avx512 cpu.npz
    .venv/bin/python benchmarks/h200/session29/kernel_outputs.py compare cpu.npz gpu.npz

Both builds come from one pipeline, so their launches match by kernel name and occurrence where
the targets fuse alike (a name only one side has is listed apart). ``compare`` prints, in launch
order, each launch's largest relative L2 difference over its arguments: the first launch whose
difference jumps past the narrow type's rounding (1e-3 for float16) while its inputs agree is the
kernel that computes differently. CUDA graphs are off so that every launch is seen.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np


def record(source: str, dtype: str, target: str, out: str) -> None:
    import tvm  # noqa: PLC0415

    from tvmfuse import api  # noqa: PLC0415

    folder = Path(tempfile.mkdtemp(prefix="kernel-outputs-"))
    rules = folder / "rules.toml"
    rules.write_text("[default]\ncuda_graph = { enabled = false }\n")
    model = api.import_model(source)
    compiled = api.compile_model(model, api.get_target(target), api.BuildOptions(
        use_database=False, dtype=dtype, fusion_rules=rules))
    deployed = api.load(api.build(compiled, folder / "out"))
    seen, arrays = Counter(), {}

    def instrument(func, symbol, before_run, ret, *args):
        if not before_run:
            seen[symbol] += 1
            for i, arg in enumerate(a for a in args if isinstance(a, tvm.runtime.Tensor)):
                value = arg.numpy()
                arrays[f"{symbol}#{seen[symbol]}:{i}"] = (
                    value.astype(np.float32) if value.dtype.kind in "fV" else value)
        return 0

    deployed.vm.set_instrument(instrument)
    deployed.run(model.example_inputs)
    np.savez(out, **arrays)
    print(f"{source} {dtype} {target}: {len(arrays)} arguments of {sum(seen.values())} launches "
          f"-> {out}")


def compare(a_path: str, b_path: str) -> None:
    a, b = np.load(a_path), np.load(b_path)
    launches: dict[str, list[str]] = {}
    for key in a.files:
        launches.setdefault(key.rsplit(":", 1)[0], []).append(key)
    for launch, keys in launches.items():
        diffs = []
        for key in keys:
            if key not in b.files or a[key].shape != b[key].shape:
                continue
            x, y = a[key].astype(np.float64), b[key].astype(np.float64)
            scale = np.linalg.norm(x)
            diffs.append(np.linalg.norm(x - y) / scale if scale else float(np.abs(y).max()))
        shown = " ".join(f"{d:.1e}" for d in diffs) if diffs else f"only in {a_path}"
        print(f"{launch:80s} {max(diffs) if diffs else float('nan'):.2e}  [{shown}]")
    only_b = {k.rsplit(":", 1)[0] for k in b.files} - set(launches)
    if only_b:
        print(f"only in {b_path}:", ", ".join(sorted(only_b)))


if __name__ == "__main__":
    {"record": record, "compare": compare}[sys.argv[1]](*sys.argv[2:])
