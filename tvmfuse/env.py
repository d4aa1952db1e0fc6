"""Every TVMFUSE_* environment variable, declared and read here only."""

import os
from pathlib import Path

#: The tuning databases shipped with tvmfuse, one folder per target key: the repository's
#: ``tuning_logs/``, installed inside the package (``tvmfuse/tuning_logs`` is a link to it in a
#: checkout). Read-only: builds apply them, nothing writes there unless named with ``--db``.
SHIPPED_TUNING_LOGS = Path(__file__).resolve().parent / "tuning_logs"


def _cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


#: Root of the user's tuning databases (``<root>/<target-key>/database_*.json``), where
#: ``tvmfuse tune`` writes by default: ``TVMFUSE_TUNING_LOGS``, else the platform's cache folder.
TUNING_LOGS = Path(os.environ.get("TVMFUSE_TUNING_LOGS")
                   or _cache_home() / "tvmfuse" / "tuning_logs")

#: The compiled-kernel cache (:mod:`tvmfuse.kernel_cache`), beside the user's tuning logs:
#: ``TVMFUSE_KERNEL_CACHE``, else the platform's cache folder. Holds CUDA binaries by the digest
#: of what made them; deleting it costs only a recompile.
KERNEL_CACHE = Path(os.environ.get("TVMFUSE_KERNEL_CACHE")
                    or _cache_home() / "tvmfuse" / "kernels")

#: ``TVMFUSE_NO_CACHE=1`` turns the kernel cache off for every command (``tvmfuse build
#: --no-cache`` for one build): nothing is read from it or written to it.
CACHE_ENABLED = os.environ.get("TVMFUSE_NO_CACHE", "").lower() not in ("1", "true", "yes", "on")


def tvm_cuda_compile_settings() -> dict[str, str]:
    """TVM's own environment variables that change how it compiles CUDA C
    (``tvm.support.nvcc``: the compiler, ptxas and NVRTC options, fast math, debug info), as set
    now: part of a kernel cache key, so a binary made under other settings is not reused."""
    names = ("TVM_CUDA_COMPILE_MODE", "TVM_CUDA_PTXAS_REG_LEVEL", "TVM_CUDA_PTXAS_EXTRA_OPTS",
             "TVM_CUDA_NVRTC_EXTRA_OPTS", "TVM_CUDA_NVCC_NO_FAST_MATH", "TVM_KERNEL_DEBUG",
             "TVM_KERNEL_DUMP", "CUDA_HOME", "CUDA_PATH")
    return {name: os.environ[name] for name in names if name in os.environ}

#: Seconds to wait for an RPC tracker to accept a connection before saying it is not there.
RPC_CONNECT_TIMEOUT_S = float(os.environ.get("TVMFUSE_RPC_CONNECT_TIMEOUT", "5"))

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
