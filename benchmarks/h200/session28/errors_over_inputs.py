"""Our error and PyTorch's in the same precision over six other random inputs (drawn as the
example was, token ids within the vocabulary, seeds 1-6), on this CPU or on the GPU (both sides
there), each output's and the model's (the largest): whether one input's comparison is chance.

    .venv/bin/python benchmarks/h200/session28/errors_over_inputs.py swin_small float16
    python3 benchmarks/h200/session28/errors_over_inputs.py llama_prefill_small float16 cuda-sm90
"""

from __future__ import annotations

import sys
import tempfile

import numpy as np

from tvmfuse import api
from tvmfuse.specs import random_inputs
from tvmfuse.targets import host_target_name
from tvmfuse.verify import relative_error


def main(name: str, dtype: str, target: str = "", inputs: int = 6) -> None:
    target = target or host_target_name()
    model = api.import_model(f"benchmarks/suite/models.py:{name}")
    compiled = api.compile_model(model, api.get_target(target),
                                 api.BuildOptions(use_database=False, dtype=dtype))
    deployed = api.load(api.build(compiled, tempfile.mkdtemp() + "/out"))
    peer = model.reference_in(dtype, "cuda" if target.startswith("cuda") else "cpu")
    ours, theirs = [], []
    for seed in range(1, int(inputs) + 1):
        arrays = random_inputs(model.inputs, model.value_ranges, seed=seed)
        refs = model.reference(*arrays)
        ours.append([relative_error(o, r) for o, r in zip(deployed.run(arrays), refs)])
        theirs.append([relative_error(o, r) for o, r in zip(peer(*arrays), refs)])
    if len(ours[0]) > 1:  # which output's error is the model's (the largest)
        print(name, dtype, target, "each output, mean over inputs: ours",
              " ".join(f"{e:.2e}" for e in np.mean(ours, axis=0)), "| pytorch",
              " ".join(f"{e:.2e}" for e in np.mean(theirs, axis=0)))
    ours, theirs = [max(e) for e in ours], [max(e) for e in theirs]
    print(name, dtype, target, "ours", " ".join(f"{e:.2e}" for e in ours), "| pytorch",
          " ".join(f"{e:.2e}" for e in theirs),
          f"| mean ratio {np.mean(ours) / np.mean(theirs):.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
