"""Find the first kernel of a build that turns finite inputs into NaN or infinity: build
``MODEL`` (a ``file.py:factory`` or zoo name) for ``TARGET`` in ``DTYPE`` without CUDA graphs
(the VM's instrument sees each kernel launch), run it on the example inputs and check every
tensor argument before and after each call. Prints the culprits and saves the first one's
arguments (before the call) to ``$OUT/first-nan.npz``.

    python3 benchmarks/h200/session28/first_nan.py benchmarks/suite/models.py:t5_small float16
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import tvm

from tvmfuse import api


def _finite(tensor) -> bool:
    array = tensor.numpy()
    return array.dtype.kind not in "fV" or bool(np.isfinite(array.astype(np.float32)).all())


def main(source: str, dtype: str, target: str = "cuda-sm90") -> None:
    folder = Path(tempfile.mkdtemp(prefix="first-nan-"))
    rules = folder / "rules.toml"
    rules.write_text("[default]\ncuda_graph = { enabled = false }\n")
    model = api.import_model(source)
    compiled = api.compile_model(model, api.get_target(target), api.BuildOptions(
        use_database=False, dtype=dtype, fusion_rules=rules))
    deployed = api.load(api.build(compiled, folder / "out"))
    implementations = compiled.analysis.implementations
    before, culprits, calls = {}, [], []

    def instrument(func, symbol, before_run, ret, *args):
        tensors = [a for a in args if isinstance(a, tvm.runtime.Tensor)]
        if before_run:
            before["finite"] = [_finite(t) for t in tensors]
            before["arrays"] = [t.numpy() for t in tensors] if not culprits else None
            return 0
        calls.append(symbol)
        turned = [i for i, (was, t) in enumerate(zip(before["finite"], tensors))
                  if was and not _finite(t)]
        if turned:
            culprits.append(symbol)
            print(f"{symbol} ({implementations.get(symbol, '?')}): argument(s) {turned} became "
                  f"non-finite; shapes {[tuple(t.shape) for t in tensors]} "
                  f"{[str(t.dtype) for t in tensors]}; inputs finite {before['finite']}")
            if len(culprits) == 1 and before["arrays"] is not None:
                out = Path(os.environ.get("OUT", folder))
                np.savez(out / "first-nan.npz", **{f"arg{i}": a.astype(np.float32)
                         if a.dtype.kind == "V" else a for i, a in enumerate(before["arrays"])})
        return 0

    deployed.vm.set_instrument(instrument)
    outputs = deployed.run(model.example_inputs)
    print(f"{source} {dtype}: {len(calls)} calls checked, {len(culprits)} made non-finite values; "
          f"outputs finite: {[bool(np.isfinite(o).all()) for o in outputs]}")


if __name__ == "__main__":
    main(*sys.argv[1:])
