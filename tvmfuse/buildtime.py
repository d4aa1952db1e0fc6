"""Where a build's time goes: seconds per stage (the model's import, each pipeline phase, TIR
lowering, code generation, CUDA compilation, export), measured with ``time.perf_counter`` around
the real calls, reported as one line at the end of ``tvmfuse build`` and kept in the manifest.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field

from . import pipeline

#: The stages outside the pipeline's phases, in the order a build runs them. ``startup`` loads
#: PyTorch, TVM and tvmfuse's compiler (the command line's, before the import); ``database`` reads
#: the tuning records; ``reuse`` digests what the build depends on, to keep an unchanged
#: earlier build (:mod:`tvmfuse.reuse`); ``analysis`` is tvmfuse's own reading of each phase's
#: output (kernels, fusion groups, IR dumps); ``tir_lower`` is TVM's TIR pipeline over the
#: scheduled kernels; ``codegen`` writes LLVM's machine code and the CUDA C (``target.build.*``);
#: ``cuda_compile`` turns the CUDA C into a binary (NVRTC or nvcc, or the kernel cache);
#: ``export`` links the shared library; ``reference`` runs the model in PyTorch (or ONNX
#: Runtime) for ``check.npz``.
STAGES = ("startup", "import", "reuse", "calibrate", "database", *pipeline.PHASES, "analysis",
          "tir_lower", "codegen", "cuda_compile", "export", "reference")

#: How the one-line report groups the stages: (label, stages).
_GROUPS = (
    ("startup", ("startup",)),
    ("import", ("import",)),
    ("reuse check", ("reuse",)),
    ("int8 calibration", ("calibrate",)),
    ("passes", ("fold", "canonicalize", "fuse_patterns", "legalize", "fuse_ops",
                "verify_fusion", "fuse_tir", "prepack", "lower", "analysis")),
    ("scheduling", ("database", "apply_database", "schedule")),
    ("TIR lowering", ("tir_lower",)),
    ("codegen", ("codegen",)),
    ("CUDA compile", ("cuda_compile",)),
    ("export", ("export",)),
    ("reference outputs", ("reference",)),
)


@dataclass
class BuildTimes:
    """Seconds spent per stage (:data:`STAGES`) of one build, and the wall time since the build
    began (``started``, a ``time.perf_counter`` reading): what the stages leave unaccounted is
    the difference."""

    started: float = field(default_factory=time.perf_counter)
    seconds: dict[str, float] = field(default_factory=dict)
    #: CUDA binaries the kernel cache served, and those compiled (see tvmfuse.kernel_cache).
    cuda_cached: int = 0
    cuda_compiled: int = 0
    #: Whether the library holds CUDA C that is compiled when it loads: what TVM builds in a
    #: process without the CUDA runtime (a machine with no GPU), not a stage of the build.
    cuda_at_load: bool = False

    def add(self, stage: str, seconds: float) -> None:
        assert stage in STAGES, stage
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    @contextlib.contextmanager
    def measure(self, stage: str):
        """Add the seconds the ``with`` body takes to ``stage``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - start)

    def wall(self) -> float:
        """Seconds since the build began."""
        return time.perf_counter() - self.started

    def to_json(self) -> dict:
        """The stages in the order they run, the wall time, and the CUDA cache's counts."""
        return {"total": round(self.wall(), 2),
                "stages": {s: round(self.seconds[s], 3) for s in STAGES if s in self.seconds},
                "cuda_binaries": {"cached": self.cuda_cached, "compiled": self.cuda_compiled,
                                  "at_load": self.cuda_at_load}}

    def line(self, extra: dict[str, float] | None = None) -> str:
        """One line for the log: the total, then each group of stages that took any time, then
        what no stage accounts for; ``extra`` adds stages after the build (``verify``)."""
        total = self.wall()
        parts = []
        for label, stages in _GROUPS:
            spent = sum(self.seconds.get(s, 0.0) for s in stages)
            if any(s in self.seconds for s in stages):
                note = ""
                if label == "CUDA compile" and self.cuda_cached + self.cuda_compiled:
                    note = f" ({self.cuda_cached} cached, {self.cuda_compiled} compiled)"
                parts.append(f"{label} {spent:.1f}{note}")
            elif label == "CUDA compile" and self.cuda_at_load:
                parts.append("CUDA compile when the library loads")
        parts.append(f"other {max(total - sum(self.seconds.values()), 0.0):.1f}")
        for label, spent in (extra or {}).items():
            parts.append(f"{label} {spent:.1f}")
            total += spent
        return f"build time {total:.1f} s: " + ", ".join(parts)


@contextlib.contextmanager
def codegen_split(times: BuildTimes, cuda_module: bool):
    """Inside the ``with``, ``tvm.compile`` is timed in three: TIR lowering, code generation
    (TVM's ``target.build.<kind>`` for each target, as ``tvm.tirx.build`` calls it), and the
    CUDA compilation inside code generation (counted by :mod:`tvmfuse.kernel_cache`, whose
    compile callback TVM calls from there). ``cuda_module``: the build makes one, so a CUDA
    compilation that did not happen here happens when the library loads."""
    from . import kernel_cache  # noqa: PLC0415 - loads TVM

    build_module = sys.modules["tvm.tirx.build"]
    original = build_module.codegen_build
    spent = [0.0]

    def timed_codegen_build(mod, target):
        start = time.perf_counter()
        try:
            return original(mod, target)
        finally:
            spent[0] += time.perf_counter() - start

    cuda_before = kernel_cache.STATS.snapshot()
    start = time.perf_counter()
    build_module.codegen_build = timed_codegen_build
    try:
        yield
    finally:
        build_module.codegen_build = original
        total = time.perf_counter() - start
        cuda = kernel_cache.STATS.since(cuda_before)
        times.add("tir_lower", total - spent[0])
        times.add("codegen", spent[0] - cuda.seconds)
        if cuda.cached + cuda.compiled:
            times.add("cuda_compile", cuda.seconds)
            times.cuda_cached += cuda.cached
            times.cuda_compiled += cuda.compiled
        elif cuda_module:
            times.cuda_at_load = True
