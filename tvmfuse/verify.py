"""Check a build's outputs against the reference it was imported from (PyTorch or ONNX Runtime).

The measure is the relative L2 error per output, ``||out - ref|| / ||ref||``, against a tolerance
set by the output's dtype. A symbolic batch is checked at two sizes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from .errors import TvmfuseError
from .frontend import ImportedModel
from .runtime import Deployed

log = logging.getLogger(__name__)

#: Largest relative L2 error accepted per output dtype; integer outputs must match exactly.
TOLERANCE = {"float64": 1e-7, "float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}


@dataclass(frozen=True)
class OutputCheck:
    name: str
    batch: int
    rel_err: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.rel_err <= self.tolerance


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    if out.shape != ref.shape:
        return float("inf")
    diff = np.linalg.norm((out.astype(np.float64) - ref.astype(np.float64)).ravel())
    norm = np.linalg.norm(ref.astype(np.float64).ravel())
    return float(diff / norm) if norm > 0 else float(diff)


def verify(deployed: Deployed, model: ImportedModel) -> list[OutputCheck]:
    """Run the build and the reference on the model's example inputs and compare every output.

    Raises a TvmfuseError naming the first output over its tolerance.
    """
    if model.reference is None:
        raise TvmfuseError(
            f"{model.source} has no reference to verify against; install onnxruntime "
            f"(pip install 'tvmfuse[onnx]') or build without --verify"
        )
    batches = [model.example_inputs]
    if any(isinstance(d, str) for s in model.inputs for d in s.shape[:1]):
        batches.append([np.concatenate([a, a[::-1]]) for a in model.example_inputs])
    checks = []
    for arrays in batches:
        outs = deployed.run(arrays)
        refs = model.reference(*arrays)
        if len(outs) != len(refs):
            raise TvmfuseError(
                f"the build returns {len(outs)} outputs, {model.reference_name} {len(refs)}"
            )
        for spec, out, ref in zip(deployed.outputs, outs, refs):
            tol = TOLERANCE.get(spec.dtype, 0.0)
            checks.append(OutputCheck(spec.name, len(arrays[0]), relative_error(out, ref), tol))
    for check in checks:
        log.info("verify %s (batch %d): relative L2 error %.2e (tolerance %.0e) against %s",
                 check.name, check.batch, check.rel_err, check.tolerance, model.reference_name)
    bad = [c for c in checks if not c.ok]
    if bad:
        c = bad[0]
        raise TvmfuseError(
            f"output {c.name} (batch {c.batch}) differs from {model.reference_name}: relative L2 "
            f"error {c.rel_err:.3e} > tolerance {c.tolerance:.0e}"
        )
    return checks
