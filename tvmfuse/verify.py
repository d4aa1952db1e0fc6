"""Check a build's outputs against the reference it was imported from (PyTorch or ONNX Runtime).

The measure is the relative L2 error per output, ``||out - ref|| / ||ref||``, against a tolerance
set by the output's dtype, over the elements where both are finite: the NaN and +/-Inf of an output
must stand where the reference's stand, or the output fails whatever its error. A symbolic batch is
checked at two sizes, a symbolic sequence at several lengths up to its bound (a prime among them, so
that no tile divides it).

A fp16 or bf16 build of a PyTorch model is also compared with PyTorch itself in that precision
on the same inputs (its *peer*): an output passes within its precision's tolerance, or, where
the model is too sensitive for that precision (PyTorch's own bf16 EfficientNet is 4.4e-2 off its
float32), when it is no less accurate than the peer. Both errors go into the manifest
(:func:`record`), and ``tvmfuse run --check`` accepts the peer's error recorded there.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .errors import TvmfuseError, one_line
from .runtime import MANIFEST, Deployed
from .specs import AGREEMENT_SEEDS, symbolic_sizes

if TYPE_CHECKING:  # the deployment path (`tvmfuse run --check`) imports no frontend
    from .frontend import ImportedModel

log = logging.getLogger(__name__)

#: The least agreement an int8 build verifies with: the share of inputs whose largest logit is
#: the reference's (a classifier's 2-D first output), else the mean cosine similarity.
MIN_AGREEMENT = {"top1": 0.99, "cosine": 0.99}

#: Largest relative L2 error accepted per output dtype; integer outputs must match exactly.
TOLERANCE = {"float64": 1e-7, "float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2, "int8": 1e-1}


@dataclass(frozen=True)
class OutputCheck:
    name: str
    #: The shape checked, as the log says it: ``"batch 1"``, ``"batch 2, seq 61"``.
    at: str
    rel_err: float
    tolerance: float
    #: The error of the reference framework in the build's precision on the same inputs
    #: ("pytorch float16"), where there is one (fp16 and bf16 builds of PyTorch models).
    peer: str | None = None
    peer_err: float | None = None
    #: How the output's NaN and +/-Inf differ from the reference's (:func:`nonfinite_mismatch`),
    #: None where they stand in the same places.
    nonfinite: str | None = None
    #: How the peer's NaN and +/-Inf differ from the reference's, where they do: the model
    #: itself overflows (or divides zero by zero) in the build's precision.
    peer_nonfinite: str | None = None

    @property
    def ok(self) -> bool:
        return self.nonfinite is None and (self.rel_err <= self.tolerance or (
            self.peer_err is not None and self.rel_err <= self.peer_err))

    def to_json(self) -> dict:
        return {"output": self.name, "at": self.at, "rel_err": self.rel_err,
                "tolerance": self.tolerance, "peer": self.peer, "peer_err": self.peer_err,
                "nonfinite": self.nonfinite, "peer_nonfinite": self.peer_nonfinite}


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """``||out - ref|| / ||ref||`` over the elements where both are finite (where the NaN and Inf
    differ, :func:`nonfinite_mismatch` says so); inf for different shapes."""
    if out.shape != ref.shape:
        return float("inf")
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    finite = np.isfinite(out) & np.isfinite(ref)
    out, ref = out[finite], ref[finite]
    diff = np.linalg.norm(out - ref)
    norm = np.linalg.norm(ref)
    return float(diff / norm) if norm > 0 else float(diff)


def nonfinite_mismatch(out: np.ndarray, ref: np.ndarray) -> str | None:
    """Where ``out`` has a NaN or an infinity that ``ref`` has not at the same element, or the
    other way round, in words ("NaN at 10 elements where the reference is finite (the first at
    (0, 3))"); None where they agree (or the shapes differ: the error says that)."""
    out, ref = np.asarray(out), np.asarray(ref)
    if out.shape != ref.shape or not (np.issubdtype(out.dtype, np.inexact)
                                      or np.issubdtype(ref.dtype, np.inexact)):
        return None
    out, ref = out.astype(np.float64), ref.astype(np.float64)
    cases = [
        ("NaN", "the reference is not NaN", np.isnan(out) & ~np.isnan(ref)),
        ("no NaN", "the reference is NaN", ~np.isnan(out) & np.isnan(ref)),
        ("+Inf", "the reference is not +Inf", (out == np.inf) & (ref != np.inf)),
        ("-Inf", "the reference is not -Inf", (out == -np.inf) & (ref != -np.inf)),
        ("a finite value", "the reference is infinite",
         np.isfinite(out) & np.isinf(ref)),
    ]
    for what, where, wrong in cases:
        if wrong.any():
            first = tuple(int(i) for i in np.argwhere(wrong)[0])
            return (f"{what} at {int(wrong.sum())} of {wrong.size} elements where {where} "
                    f"(the first at {first})")
    return None


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
    peer, run_peer = _peer_name(deployed, model), None
    sets = _input_sets(model)
    for at, arrays in sets:
        refs = model.reference(*arrays)
        peer_errs = peer_nonfinite = None
        if peer is not None:
            try:  # the PyTorch model in the build's precision, made on first use
                run_peer = run_peer or model.reference_in(deployed.precision,
                                                          _peer_device(deployed))
                peer_outs = run_peer(*arrays)
                peer_errs = [relative_error(o, r) for o, r in zip(peer_outs, refs)]
                peer_nonfinite = [nonfinite_mismatch(o, r) for o, r in zip(peer_outs, refs)]
            except Exception as err:  # noqa: BLE001 - a module that cannot change precision or
                # device, or an op without a kernel in that precision
                log.warning("cannot run %s (%s): the build is checked against the tolerance "
                            "alone", peer, one_line(err))
                peer = None
        checks += compare(deployed, deployed.run(arrays), refs, at, model.reference_name,
                          peer, peer_errs, peer_nonfinite)
    wrong = next((c for c in checks if not c.ok), None)  # the one _judge reports
    if wrong is not None and wrong.nonfinite is None and model.exported is not None:
        _blame_the_export(deployed, model, wrong, dict(sets)[wrong.at])
    return _judge(checks, model.reference_name)


def _blame_the_export(deployed: Deployed, model: ImportedModel, check: OutputCheck,
                      arrays: list[np.ndarray]) -> None:
    """Raise where torch.export's own program differs from the module as the build does and the
    build follows that program: the export, not tvmfuse, lost what the module computes."""
    index = [spec.name for spec in deployed.outputs].index(check.name)
    try:
        program = model.exported(*arrays)[index]
    except Exception as err:  # noqa: BLE001 - the program is only a second opinion here
        log.debug("cannot run the exported program: %s", one_line(err))
        return
    own = relative_error(program, model.reference(*arrays)[index])
    followed = relative_error(deployed.run(arrays)[index], program)
    if own > check.tolerance >= followed:
        raise TvmfuseError(
            f"output {check.name} ({check.at}) differs from {model.reference_name} "
            f"({check.rel_err:.3e}), as torch.export's own program does ({own:.3e}), which the "
            f"build follows ({followed:.1e}): the module computes something its export does not "
            f"capture (a branch on its inputs' values, or state its forward changes), and "
            f"tvmfuse builds the model as torch.export sees it: make the forward free of both, "
            f"or build without --verify")


def agreement(run, reference, draws) -> dict[str, float] | None:
    """How closely ``run`` (inputs -> outputs) follows ``reference`` on the input sets ``draws``,
    judged on the first output: the share of its rows whose largest entry is the reference's
    (``top1``) where it is 2-D, a classifier's logits; else the mean over the inputs of the cosine
    similarity of the whole output (``cosine``), an encoder's hidden states. None where the first
    output is not floating point."""
    same = total = 0
    cosines = []
    for arrays in draws:
        out, ref = run(arrays)[0], reference(*arrays)[0]
        if ref.dtype.kind != "f":
            return None
        out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
        if ref.ndim == 2:
            same += int((out.argmax(-1) == ref.argmax(-1)).sum())
            total += ref.shape[0]
        else:
            norms = np.linalg.norm(out) * np.linalg.norm(ref)
            cosines.append(float(out.ravel() @ ref.ravel() / norms) if norms else 0.0)
    return {"top1": same / total} if total else {"cosine": float(np.mean(cosines))}


def verify_agreement(deployed: Deployed, model: ImportedModel) -> dict[str, float] | None:
    """An int8 build's :func:`agreement` with the reference on inputs drawn with the
    AGREEMENT_SEEDS; raises a TvmfuseError where it is under MIN_AGREEMENT."""
    found = agreement(deployed.run, model.reference,
                      (model.drawn(seed) for seed in AGREEMENT_SEEDS))
    if found is None:
        return None
    (measure, value), = found.items()
    log.info("verify: %s agreement with %s over %d inputs: %.4g", measure,
             model.reference_name, len(AGREEMENT_SEEDS), value)
    if not value >= MIN_AGREEMENT[measure]:  # NaN outputs agree with nothing
        raise TvmfuseError(f"the int8 build agrees with {model.reference_name} on {value:.1%} "
                           f"({measure}) of {len(AGREEMENT_SEEDS)} inputs, under "
                           f"{MIN_AGREEMENT[measure]:.0%}: this model loses too much in int8; "
                           f"calibrate on real inputs (--calibrate) or build it in bf16")
    return found


def _peer_name(deployed: Deployed, model: ImportedModel) -> str | None:
    """What a narrow build is also held against: the PyTorch model in the build's precision
    ("pytorch float16"); None for float32 builds and ONNX models."""
    if deployed.precision in ("float32", "int8") or model.torch_module is None:
        return None  # PyTorch has no int8 of the model to run
    return f"{model.reference_name} {deployed.precision}"


def _peer_device(deployed: Deployed) -> str:
    """The build's GPU where it runs on one here, else the CPU."""
    return "cuda" if deployed.rpc is None and str(deployed.device).startswith("cuda") else "cpu"


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
    # the peer's errors on these inputs, measured when the build was verified
    recorded = deployed.manifest.get("verification", {})
    try:
        peers = {c["output"]: (c["peer"], float(c["peer_err"]))
                 for c in recorded.get("checks", [])
                 if c["at"] == recorded.get("examples_at") and c.get("peer_err") is not None}
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise TvmfuseError(f"{deployed.path / MANIFEST} is damaged (its verification record: "
                           f"{type(err).__name__}: {err}); rebuild the model with --verify") \
            from None
    peer_errs = [peers.get(s.name, (None, None))[1] for s in deployed.outputs]
    peer = next((p for p, _ in peers.values()), None)
    return _judge(compare(deployed, deployed.run(inputs), refs, "the saved inputs", name,
                          peer, peer_errs), name)


def compare(deployed: Deployed, outs, refs, at: str, reference_name: str,
            peer: str | None = None, peer_errs: list | None = None,
            peer_nonfinite: list | None = None) -> list[OutputCheck]:
    if len(outs) != len(refs):
        raise TvmfuseError(f"the build returns {len(outs)} outputs, {reference_name} {len(refs)}")
    _warn_if_uninformative(refs, deployed.outputs, reference_name)
    # a fp16 build's float32 outputs carry float16's error (integer outputs must still match)
    widened = TOLERANCE.get(deployed.precision, 0.0)
    peer_errs = peer_errs or [None] * len(refs)
    peer_nonfinite = peer_nonfinite or [None] * len(refs)
    return [OutputCheck(spec.name, at, relative_error(out, ref),
                        max(TOLERANCE[spec.dtype], widened) if spec.dtype in TOLERANCE else 0.0,
                        peer if peer_err is not None else None, peer_err,
                        nonfinite_mismatch(out, ref), peer_wrong)
            for spec, out, ref, peer_err, peer_wrong
            in zip(deployed.outputs, outs, refs, peer_errs, peer_nonfinite)]


def record(folder, checks: list[OutputCheck], reference_name: str,
           agreed: dict[str, float] | None = None) -> None:
    """Write what verification measured into the manifest of the (staged) build in ``folder``:
    every check, and which of them ran on the example inputs (those ``check.npz`` saves, where
    ``tvmfuse run --check`` takes the peer's errors from); an int8 build's ``agreement``."""
    path = Path(folder) / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["verification"] = {
        "reference": reference_name,
        "examples_at": checks[0].at if checks else None,  # verify checks the examples first
        "checks": [c.to_json() for c in checks],
    }
    if agreed is not None:
        manifest["verification"]["agreement"] = {**agreed, "inputs": len(AGREEMENT_SEEDS)}
    path.write_text(json.dumps(manifest, indent=2) + "\n")


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
        peer = "" if check.peer_err is None else f"; {check.peer} {check.peer_err:.2e}"
        log.info("verify %s (%s): relative L2 error %.2e (tolerance %.0e%s) against %s",
                 check.name, check.at, check.rel_err, check.tolerance, peer, reference_name)
        if check.ok and check.rel_err > check.tolerance:
            log.warning("output %s (%s) is over its tolerance %.0e, but no less accurate than "
                        "%s (%.2e against %.2e): this model's error in this precision",
                        check.name, check.at, check.tolerance, check.peer, check.rel_err,
                        check.peer_err)
    bad = [c for c in checks if not c.ok]
    if bad:
        c = bad[0]
        if c.nonfinite is not None and c.peer_nonfinite is not None:
            raise TvmfuseError(f"output {c.name} ({c.at}) differs from {reference_name}: "
                               f"{c.nonfinite}, and {c.peer} has {c.peer_nonfinite}: the model "
                               f"does not compute in this precision (its values overflow or "
                               f"vanish); build it in fp32 or bf16")
        if c.nonfinite is not None:
            raise TvmfuseError(f"output {c.name} ({c.at}) differs from {reference_name}: "
                               f"{c.nonfinite}; the build does not keep the reference's "
                               f"NaN/Inf: report it as a tvmfuse bug, with the model")
        peer = "" if c.peer_err is None else f" and {c.peer}'s {c.peer_err:.3e}"
        raise TvmfuseError(
            f"output {c.name} ({c.at}) differs from {reference_name}: relative L2 "
            f"error {c.rel_err:.3e} > tolerance {c.tolerance:.0e}{peer}"
        )
    return checks
