"""Every TVMFUSE_* environment variable, declared and read here only."""

import os
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parent.parent

#: Root of the per-target tuning databases (``<root>/<target-key>/database_*.json``).
TUNING_LOGS = Path(os.environ.get("TVMFUSE_TUNING_LOGS", _REPO_ROOT / "tuning_logs"))

#: Log level of the CLI (DEBUG, INFO, WARNING, ...).
LOG_LEVEL = os.environ.get("TVMFUSE_LOG_LEVEL", "INFO").upper()


def configure_tvm_threads() -> None:
    """Give TVM's thread pool every core this process may run on and leave the threads unpinned,
    unless TVM_NUM_THREADS / TVM_BIND_THREADS say otherwise. Must run before the first kernel
    does: the pool reads the variables when it starts.

    - TVM's default halves the core count on x86 (it assumes hyper-threading), which on this
      2-core machine ran every kernel on one thread.
    - TVM binds its workers, and the calling (Python) thread, to fixed cores. On this 2-core VM
      that made one process in four slow for its whole life: the built ResNet-50, median of 40
      runs per process, 4 of 16 processes at 20.7–21.2 ms, the others at 17.0–18.3; unpinned,
      16 of 16 at 17.0–17.9 ms.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    os.environ.setdefault("TVM_NUM_THREADS", str(cores))
    os.environ.setdefault("TVM_BIND_THREADS", "0")


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
