"""Every TVMFUSE_* environment variable, declared and read here only."""

import os
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parent.parent

#: Root of the per-target tuning databases (``<root>/<target-key>/database_*.json``).
TUNING_LOGS = Path(os.environ.get("TVMFUSE_TUNING_LOGS", _REPO_ROOT / "tuning_logs"))

#: Log level of the CLI (DEBUG, INFO, WARNING, ...).
LOG_LEVEL = os.environ.get("TVMFUSE_LOG_LEVEL", "INFO").upper()


def use_all_cores() -> None:
    """Give TVM's thread pool every core this process may run on, unless TVM_NUM_THREADS says
    otherwise. TVM's own default halves the core count on x86 (it assumes hyper-threading), which
    on this 2-core machine ran every kernel on one thread. Must run before the first kernel does:
    the pool reads the variable when it starts."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    os.environ.setdefault("TVM_NUM_THREADS", str(cores))


def short_openmp_spin() -> None:
    """Let PyTorch's idle OpenMP workers spin only briefly before they sleep, for runs that time
    PyTorch and another engine on the same cores: with libgomp's default (300k rounds) they took
    the cores from the engine timed next (tvmfuse's ResNet-50 measured 48 ms after ONNX Runtime,
    62 ms after torch.compile); OMP_WAIT_POLICY=PASSIVE instead cost torch.compile 35%. Read
    when PyTorch loads OpenMP, so call it before torch is imported."""
    os.environ.setdefault("GOMP_SPINCOUNT", "20000")

#: Where `tvmfuse arm-host` keeps its emulated arm64 root and its server logs (about 830 MB).
ARM_HOST_DIR = Path(os.environ.get("TVMFUSE_ARM_HOST_DIR",
                                   Path.home() / ".cache" / "tvmfuse" / "arm64-host"))
