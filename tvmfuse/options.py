"""The build options: the one object that carries what the user decides about a build from the
CLI (or a script) through :mod:`tvmfuse.api` and :mod:`tvmfuse.compiler` to the pipeline's
passes, and to ``tvmfuse tune``, which tunes the kernels the same options build."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import TvmfuseError

#: What a build can compute in: float16 is TVM's ToMixedPrecision (convs, matmuls and what
#: follows them in float16, inputs and outputs float32); bfloat16 the same decisions with the
#: narrow type renamed (NarrowToBFloat16); int8 the GEMMs and convs over constant weights in
#: uint8 x int8 with int32 sums, the rest float32 (QuantizeInt8, calibrated).
PRECISIONS = ("float32", "float16", "bfloat16", "int8")


@dataclass(frozen=True)
class BuildOptions:
    """How to compile: the CLI fills this in, the pipeline reads it.

    ``database`` is a MetaSchedule JSON database folder; ``None`` takes the target's databases
    (the user's records over the shipped ones: :mod:`tvmfuse.tuning.lookup`) when they hold
    records, and ``use_database=False`` applies none at all. ``tvmfuse tune`` writes into
    ``database`` (None: the user's database of the target).
    ``dump_ir`` is a folder for the IR after each pipeline phase.
    ``fusion_rules`` is a rules file over the shipped defaults (see :mod:`tvmfuse.rules`).
    ``verify_fusion`` checks every fused group against its ops run one by one and splits back
    the ones that fail (:class:`tvmfuse.passes.VerifyFusion`).
    ``dtype`` is the precision the kernels compute in (one of :data:`PRECISIONS`; inputs and
    outputs stay float32); ``accumulator`` is what the matmuls and convs of a lower precision
    sum in (None: their own dtype; see :mod:`tvmfuse.strategy.accumulate`). ``fusion=False``
    turns tvmfuse's own fusion rules off (:data:`tvmfuse.rules.FUSION_RULES`) and keeps the
    rest: the "fusion alone" baseline, same layouts and schedules, TVM's FuseOps only.
    ``cache=False`` compiles every CUDA binary afresh rather than through the kernel cache
    (:mod:`tvmfuse.kernel_cache`; ``TVMFUSE_NO_CACHE`` turns it off everywhere).
    An int8 build is calibrated on ``calibrate`` (a ``.npz`` of input sets: see
    :mod:`tvmfuse.calibrate`; None: seeded inputs drawn as ``--verify`` draws them);
    ``int8_ranges`` are the ranges the calibration measured, which the build then quantizes with
    (set by the compiler; None: the pipeline builds the calibration's observing module).
    """

    database: Path | None = None
    use_database: bool = True
    dump_ir: Path | None = None
    fusion_rules: Path | None = None
    verify_fusion: bool = False
    dtype: str = "float32"
    accumulator: str | None = "float32"
    fusion: bool = True
    cache: bool = True
    calibrate: Path | None = None
    int8_ranges: tuple | None = None

    def __post_init__(self):
        if self.dtype not in PRECISIONS:
            raise TvmfuseError(f"tvmfuse computes in {', '.join(PRECISIONS)}, not {self.dtype}")
