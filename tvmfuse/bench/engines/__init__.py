"""The engines `tvmfuse bench` compares, each prepared on the same model and inputs.

An engine is a blocking zero-argument callable for timing plus what it cost to prepare. A peer that
cannot be prepared here (no onnxruntime, an export that fails) raises :class:`Unavailable` and is
skipped with one log line. Each family's module (:mod:`.tvm_builds`, :mod:`.pytorch`,
:mod:`.ort`, :mod:`.ov`) registers its engines with :func:`register`; :data:`ENGINES` lists them
in the order they are prepared.

Precision (``BenchContext.dtype``): every engine computes in it, and its outputs are compared
with the float32 PyTorch reference. PyTorch engines run the module and float inputs cast to it;
ONNX Runtime runs that module's export; the TVM engines run TVM's ``ToMixedPrecision`` over the
imported float32 module (convolutions and matmuls and what follows them in float16, inputs and
outputs in float32), which supports float16 only. Three peers compute in a precision of their
own, from the float32 export, whatever the bench's: ``openvino`` (what OpenVINO picks on this
CPU: bf16 where the CPU has AVX-512 BF16), ``openvino-fp32`` and ``onnxruntime-int8``; each
engine says the precision it computed in (:attr:`Engine.precision`).

The family modules import their framework (torch, onnxruntime, TVM) inside the functions that
prepare an engine: the CLI reads the names from here before anything heavy is loaded.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ...errors import TvmfuseError


class Unavailable(Exception):
    """This engine cannot run here; the message says why."""


@dataclass
class Engine:
    name: str
    run: Callable[[], object]  # one blocking inference on the bench inputs
    outputs: Callable[[], list[np.ndarray]]  # one inference, outputs as numpy (for the error)
    setup_seconds: float
    kernels: int | None = None
    #: The precision it computed in, where not the bench's (``"bfloat16"``, ``"int8"``).
    precision: str | None = None
    #: Quantized engines: how often they agree with the float32 reference on inputs other than
    #: those they were calibrated on (:func:`agreement`).
    agreement: dict[str, float] | None = None


@dataclass
class BenchContext:
    model: object  # frontend.ImportedModel
    target: object  # targets.TargetSpec
    inputs: list[np.ndarray]
    threads: int
    build_options: object  # options.BuildOptions
    torch_module: object | None  # the nn.Module for PyTorch engines, None for ONNX sources
    onnx_path: Path | None  # the ONNX file for ONNX sources
    dtype: str = "float32"  # the precision every engine computes in (see peer_dtype)
    #: Where engines write their files (ONNX exports, quantized models); None: a new temporary
    #: folder each time.
    scratch: Path | None = None
    #: The module's ONNX export by precision (or why it failed), made once for every engine
    #: that runs it.
    onnx_exports: dict[str, Path | Unavailable] = field(default_factory=dict)

    @property
    def peer_dtype(self) -> str:
        """The precision the engines without one of their own compute in: the bench's, but
        float32 in an int8 bench (an int8 build is held against the float32 engines it
        replaces, and against the quantized peers)."""
        return "float32" if self.dtype == "int8" else self.dtype

    @property
    def peer_precision(self) -> str | None:
        """What an engine computing in :attr:`peer_dtype` reports as its own precision: that
        dtype where it is not the bench's, else None."""
        return self.peer_dtype if self.peer_dtype != self.dtype else None

    def seeded_inputs(self, seed: int) -> list[np.ndarray]:
        """Inputs of the bench inputs' shapes drawn as they were, with another seed (seed
        :data:`tvmfuse.specs.SEED` draws the bench inputs themselves)."""
        from ...specs import random_inputs  # noqa: PLC0415 - numpy only, but keep the CLI light

        specs = [replace(s, shape=a.shape) for s, a in zip(self.model.inputs, self.inputs)]
        return random_inputs(specs, self.model.value_ranges, seed=seed)

    def scratch_dir(self) -> Path:
        return self.scratch or Path(tempfile.mkdtemp(prefix="tvmfuse-bench-"))


#: Engine name -> the function that prepares it, in the order `tvmfuse bench` prepares them.
_PREPARE: dict[str, Callable[[BenchContext], Engine]] = {}


def register(engine: str, **bound):
    """Decorator: ``prepare(ctx, **bound)`` prepares the engine named ``engine``."""
    def add(prepare):
        _PREPARE[engine] = (lambda ctx: prepare(ctx, **bound)) if bound else prepare
        return prepare

    return add


def prepare(name: str, ctx: BenchContext) -> Engine:
    """Prepare engine ``name`` (one of ENGINES); raises Unavailable when it cannot run here."""
    start = time.perf_counter()
    engine = _PREPARE[name](ctx)
    engine.setup_seconds = time.perf_counter() - start
    return engine


def agreement(run: Callable[[list[np.ndarray]], list[np.ndarray]], ctx: BenchContext,
              seeds: range) -> dict[str, float] | None:
    """How closely ``run`` (inputs -> outputs) follows the float32 reference on the inputs drawn
    with ``seeds`` (:func:`tvmfuse.verify.agreement`: top-1 share or mean cosine)."""
    from ...verify import agreement as measure  # noqa: PLC0415

    return measure(run, ctx.model.reference, (ctx.seeded_inputs(seed) for seed in seeds))


def check_names(names: list[str]) -> list[str]:
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise TvmfuseError(f"unknown engine {unknown[0]!r}; choose from: {', '.join(ENGINES)}")
    return names


# Imported for their registrations, in the order `tvmfuse bench` prepares and lists the engines.
from . import tvm_builds  # noqa: E402, F401, I001
from . import pytorch  # noqa: E402, F401
from . import ort  # noqa: E402, F401
from . import ov  # noqa: E402, F401

#: Every engine `tvmfuse bench` knows, in the order it prepares them.
ENGINES = tuple(_PREPARE)
