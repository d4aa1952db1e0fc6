"""Our error and PyTorch's in the same precision over six other random inputs (float inputs drawn
from a standard normal, seed 1), on this CPU: whether one input's comparison is chance.

    .venv/bin/python benchmarks/h200/session28/errors_over_inputs.py swin_small float16
"""
import sys, tempfile, numpy as np, torch
from tvmfuse import api
from tvmfuse.targets import host_target_name
from tvmfuse.verify import relative_error
name, dtype = sys.argv[1], sys.argv[2]
m = api.import_model(f"benchmarks/suite/models.py:{name}")
c = api.compile_model(m, api.get_target(host_target_name()), api.BuildOptions(use_database=False, dtype=dtype))
d = api.load(api.build(c, tempfile.mkdtemp() + "/o"))
peer = m.reference_in(dtype)
rng = np.random.default_rng(1)
ours, theirs = [], []
for i in range(6):
    x = [rng.standard_normal(a.shape).astype(a.dtype) if a.dtype.kind == "f" else a for a in m.example_inputs]
    ref = m.reference(*x)
    ours.append(max(relative_error(o, r) for o, r in zip(d.run(x), ref)))
    theirs.append(max(relative_error(o, r) for o, r in zip(peer(*x), ref)))
print(name, dtype, "ours", " ".join(f"{e:.2e}" for e in ours), "| torch", " ".join(f"{e:.2e}" for e in theirs), "| mean ratio %.3f" % (np.mean(ours) / np.mean(theirs)))
