"""The engines `tvmfuse bench` compares, each prepared on the same model and inputs.

An engine is a blocking zero-argument callable for timing plus what it cost to prepare. A peer that
cannot be prepared here (no onnxruntime, an export that fails) raises :class:`Unavailable` and is
skipped with one log line. Each family's module (:mod:`.tvm_builds`, :mod:`.pytorch`,
:mod:`.ort`) registers its engines with :func:`register`; :data:`ENGINES` lists them in the order
they are prepared.

Precision (``BenchContext.dtype``): every engine computes in it, and its outputs are compared
with the float32 PyTorch reference. PyTorch engines run the module and float inputs cast to it;
ONNX Runtime runs that module's export; the TVM engines run TVM's ``ToMixedPrecision`` over the
imported float32 module (convolutions and matmuls and what follows them in float16, inputs and
outputs in float32), which supports float16 only.

The family modules import their framework (torch, onnxruntime, TVM) inside the functions that
prepare an engine: the CLI reads the names from here before anything heavy is loaded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass
class BenchContext:
    model: object  # frontend.ImportedModel
    target: object  # targets.TargetSpec
    inputs: list[np.ndarray]
    threads: int
    build_options: object  # options.BuildOptions
    torch_module: object | None  # the nn.Module for PyTorch engines, None for ONNX sources
    onnx_path: Path | None  # the ONNX file for ONNX sources
    dtype: str = "float32"  # the precision every engine computes in


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


def check_names(names: list[str]) -> list[str]:
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise TvmfuseError(f"unknown engine {unknown[0]!r}; choose from: {', '.join(ENGINES)}")
    return names


# Imported for their registrations, in the order `tvmfuse bench` prepares and lists the engines.
from . import tvm_builds  # noqa: E402, F401, I001
from . import pytorch  # noqa: E402, F401
from . import ort  # noqa: E402, F401

#: Every engine `tvmfuse bench` knows, in the order it prepares them.
ENGINES = tuple(_PREPARE)
