"""Our error and PyTorch's in the same precision over six other random inputs (float inputs drawn
from a standard normal, seed 1), on this CPU: whether one input's comparison is chance.

    .venv/bin/python benchmarks/h200/session28/errors_over_inputs.py swin_small float16
"""

from __future__ import annotations

import sys
import tempfile

import numpy as np

from tvmfuse import api
from tvmfuse.targets import host_target_name
from tvmfuse.verify import relative_error


def main(name: str, dtype: str, inputs: int = 6) -> None:
    model = api.import_model(f"benchmarks/suite/models.py:{name}")
    compiled = api.compile_model(model, api.get_target(host_target_name()),
                                 api.BuildOptions(use_database=False, dtype=dtype))
    deployed = api.load(api.build(compiled, tempfile.mkdtemp() + "/out"))
    peer = model.reference_in(dtype)
    rng = np.random.default_rng(1)
    ours, theirs = [], []
    for _ in range(inputs):
        arrays = [rng.standard_normal(a.shape).astype(a.dtype) if a.dtype.kind == "f" else a
                  for a in model.example_inputs]
        refs = model.reference(*arrays)
        ours.append(max(relative_error(o, r) for o, r in zip(deployed.run(arrays), refs)))
        theirs.append(max(relative_error(o, r) for o, r in zip(peer(*arrays), refs)))
    print(name, dtype, "ours", " ".join(f"{e:.2e}" for e in ours), "| pytorch",
          " ".join(f"{e:.2e}" for e in theirs), f"| mean ratio {np.mean(ours) / np.mean(theirs):.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
