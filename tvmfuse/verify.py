"""Check a build's outputs against the reference it was imported from (PyTorch or ONNX Runtime).

The measure is the relative L2 error per output, ``||out - ref|| / ||ref||``, against a tolerance
set by the output's dtype. A symbolic batch is checked at two sizes, a symbolic sequence at
several lengths up to its bound (a prime among them, so that no tile divides it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from typing import TYPE_CHECKING

from .errors import TvmfuseError
from .runtime import Deployed
from .specs import symbolic_sizes

if TYPE_CHECKING:  # the deployment path (`tvmfuse run --check`) imports no frontend
    from .frontend import ImportedModel

log = logging.getLogger(__name__)

#: Largest relative L2 error accepted per output dtype; integer outputs must match exactly.
TOLERANCE = {"float64": 1e-7, "float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}


@dataclass(frozen=True)
class OutputCheck:
    name: str
    #: The shape checked, as the log says it: ``"batch 1"``, ``"batch 2, seq 61"``.
    at: str
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
    checks = []
    for at, arrays in _input_sets(model):
        checks += compare(deployed, deployed.run(arrays), model.reference(*arrays), at,
                          model.reference_name)
    return _judge(checks, model.reference_name)


def _input_sets(model: ImportedModel) -> list[tuple[str, list[np.ndarray]]]:
    """``(what, inputs)`` to check: the examples, then each symbolic dimension at other sizes
    (batch 2: the examples and their reverse; a sequence at a prime length and at its bound)."""
    sizes = {dim: size for dim, (_, size) in symbolic_sizes(model.inputs,
                                                           model.example_inputs).items()}
    sets = [(_describe(sizes), model.example_inputs)]
    if "batch" in sizes:
        sets.append((_describe({**sizes, "batch": 2 * sizes["batch"]}),
                     [np.concatenate([a, a[::-1]]) for a in model.example_inputs]))
    if "seq" in sizes:
        bound = model.bounds["seq"]
        for length in sorted({_prime_below(max(2, bound // 3)), bound} - {sizes["seq"]}):
            at = {**sizes, "seq": length}
            sets.append((_describe(at), model.inputs_at(at)))
    return sets


def _describe(sizes: dict[str, int]) -> str:
    return ", ".join(f"{name} {size}" for name, size in sizes.items()) or "the examples"


def _prime_below(n: int) -> int:
    """The largest prime <= n (n >= 2)."""
    while any(n % d == 0 for d in range(2, int(n**0.5) + 1)):
        n -= 1
    return n


def verify_saved(deployed: Deployed) -> list[OutputCheck]:
    """Run the build on the example inputs saved with it and compare with the reference outputs
    saved with them (``check.npz``): the check for a device without PyTorch."""
    saved = deployed.reference()
    if saved is None:
        raise TvmfuseError(f"{deployed.path} holds no reference outputs (the model had no "
                           f"reference when it was built); rebuild it with PyTorch or ONNX "
                           f"Runtime installed")
    inputs, refs = saved
    name = "the reference saved at build time"
    return _judge(compare(deployed, deployed.run(inputs), refs, "the saved inputs", name), name)


def compare(deployed: Deployed, outs, refs, at: str, reference_name: str) -> list[OutputCheck]:
    if len(outs) != len(refs):
        raise TvmfuseError(f"the build returns {len(outs)} outputs, {reference_name} {len(refs)}")
    _warn_if_uninformative(refs, deployed.outputs, reference_name)
    # a fp16 build's float32 outputs carry float16's error (integer outputs must still match)
    widened = TOLERANCE.get(deployed.precision, 0.0)
    return [OutputCheck(spec.name, at, relative_error(out, ref),
                        max(TOLERANCE[spec.dtype], widened) if spec.dtype in TOLERANCE else 0.0)
            for spec, out, ref in zip(deployed.outputs, outs, refs)]


def _warn_if_uninformative(refs, specs, reference_name: str) -> None:
    """A reference output that is constant (all zeros, say) cannot tell a right build from a
    wrong one: every build that outputs that constant passes. Say so."""
    for spec, ref in zip(specs, refs):
        ref = np.asarray(ref)
        if ref.size > 1 and np.all(ref == ref.flat[0]):
            log.warning("output %s of %s is the constant %s on these inputs: the check cannot "
                        "tell a right build from a wrong one (try other inputs, e.g. a model "
                        "factory returning examples)", spec.name, reference_name,
                        ref.flat[0].item())


def _judge(checks: list[OutputCheck], reference_name: str) -> list[OutputCheck]:
    for check in checks:
        log.info("verify %s (%s): relative L2 error %.2e (tolerance %.0e) against %s",
                 check.name, check.at, check.rel_err, check.tolerance, reference_name)
    bad = [c for c in checks if not c.ok]
    if bad:
        c = bad[0]
        raise TvmfuseError(
            f"output {c.name} ({c.at}) differs from {reference_name}: relative L2 "
            f"error {c.rel_err:.3e} > tolerance {c.tolerance:.0e}"
        )
    return checks
