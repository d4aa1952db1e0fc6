"""The public API, in one place: import a model, compile and build it, load and run it, time it
against its peers, tune it. Each name lives in the module that does the work; this module only
gathers them for users (``from tvmfuse import api``) and the notebooks.
"""

from __future__ import annotations

from .artifact import build
from .bench.session import bench
from .compiler import (
    Analysis,
    Compiled,
    analyze,
    benefit,
    calibrated,
    compile_model,
    profile_kernels,
)
from .frontend import import_model, import_torch
from .options import BuildOptions
from .runtime import load
from .targets import get_target
from .tuning.lookup import build_databases, default_database, default_databases
from .tuning.tune import tune_model as tune

__all__ = ["Analysis", "BuildOptions", "Compiled", "analyze", "benefit", "bench", "build",
           "build_databases", "calibrated", "compile_model", "default_database",
           "default_databases", "get_target", "import_model", "import_torch", "load",
           "profile_kernels", "tune"]
