"""Compiled CUDA binaries, cached by the digest of everything that made them, so that building
or loading an unchanged model again skips the CUDA compiler.

TVM compiles a CUDA module's C source through one callback, ``tvm_callback_cuda_compile``
(``tvm.support.nvcc``: NVRTC by default, nvcc under ``TVM_CUDA_COMPILE_MODE=nvcc``), one call
for the whole source: at code generation where this process has the CUDA runtime (a build on
the GPU machine), else when the library is loaded there. :func:`install` puts :func:`_compile`
in its place, which looks the binary up under :data:`tvmfuse.env.KERNEL_CACHE` and hands the
source to TVM's own callback only on a miss; it also counts the seconds spent
(:data:`STATS`, read by :mod:`tvmfuse.buildtime`).

The key is the SHA-256 of the source, the architecture TVM compiles for, the compiler and its
version, the CUDA toolkit, TVM's version and TVM's variables that change its compiler options
(:func:`tvmfuse.env.tvm_cuda_compile_settings`). Each entry is written to a temporary file in
the cache folder and renamed into place (a reader sees a whole entry or none), and carries the
SHA-256 of its binary: an entry that does not match is ignored with a warning and compiled again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from . import env

log = logging.getLogger(__name__)

#: The first line of every entry; a new format changes it, and old entries read as corrupt.
MAGIC = b"tvmfuse-kernel-cache 1\n"
#: The registered name TVM calls to compile CUDA C.
CALLBACK = "tvm_callback_cuda_compile"


@dataclass(frozen=True)
class Stats:
    """What the callback did in this process: seconds in it, binaries served from the cache,
    binaries compiled."""

    seconds: float = 0.0
    cached: int = 0
    compiled: int = 0

    def since(self, earlier: Stats) -> Stats:
        return Stats(self.seconds - earlier.seconds, self.cached - earlier.cached,
                     self.compiled - earlier.compiled)


class _Counter:
    def __init__(self):
        self.now = Stats()

    def snapshot(self) -> Stats:
        return self.now

    def since(self, earlier: Stats) -> Stats:
        return self.now.since(earlier)


#: The process's running totals.
STATS = _Counter()

#: TVM's own callback (set by :func:`install`) and whether the cache is used.
_state: dict = {"tvm": None, "enabled": True}


def install(enabled: bool = True) -> None:
    """Route TVM's CUDA compilation through the cache, process-wide (the first call registers
    the callback; later calls only switch the cache). ``enabled=False`` (``--no-cache``) or
    ``TVMFUSE_NO_CACHE`` compiles every time, still counted in :data:`STATS`."""
    import tvm_ffi  # noqa: PLC0415 - loaded with TVM

    if _state["tvm"] is None:
        import tvm.support.nvcc  # noqa: F401, PLC0415 - registers TVM's callback

        _state["tvm"] = tvm_ffi.get_global_func(CALLBACK)
        tvm_ffi.register_global_func(CALLBACK, _compile, override=True)
    _state["enabled"] = enabled and env.CACHE_ENABLED


def _compile(code, *rest) -> bytes:
    """The callback TVM calls with a CUDA module's source: the binary, from the cache when an
    entry matches, else from TVM's own callback (and stored)."""
    start = time.perf_counter()
    code = str(code)
    key = key_of(code) if _state["enabled"] else None
    binary = _read(key) if key is not None else None
    hit = binary is not None
    if not hit:
        binary = bytes(_state["tvm"](code, *rest))
        if key is not None:
            _write(key, binary)
    STATS.now = replace(STATS.now, seconds=STATS.now.seconds + time.perf_counter() - start,
                        cached=STATS.now.cached + hit, compiled=STATS.now.compiled + (not hit))
    log.debug("CUDA binary %s: %s", key, "from the cache" if hit else "compiled")
    return binary


def key_of(code: str) -> str | None:
    """The cache key of compiling ``code`` here and now, or None where there is none to make:
    no architecture to compile for (TVM's callback then raises its own error), the compiler's
    version unknown, or ``TVM_KERNEL_DUMP`` set (it asks for the compiler's files)."""
    from tvm.support import nvcc  # noqa: PLC0415
    from tvm.target import Target  # noqa: PLC0415

    settings = env.tvm_cuda_compile_settings()
    if "TVM_KERNEL_DUMP" in settings:
        return None
    try:
        arch = nvcc.get_target_compute_version(Target.current(allow_none=True))
    except ValueError:
        return None
    mode = settings.get("TVM_CUDA_COMPILE_MODE", "nvrtc").lower()
    compiler = _compiler_version(mode)
    if compiler is None:
        return None
    import tvm  # noqa: PLC0415

    parts = {"source": hashlib.sha256(code.encode()).hexdigest(), "arch": arch,
             "compiler": compiler, "toolkit": _toolkit(), "tvm": tvm.__version__,
             "settings": settings}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


@functools.cache
def _compiler_version(mode: str) -> str | None:
    """``nvrtc 13.0`` or nvcc's ``--version`` text; None where the compiler is not there."""
    if mode == "nvrtc":
        try:
            from cuda.bindings import nvrtc  # noqa: PLC0415

            _, major, minor = nvrtc.nvrtcVersion()
        except Exception:  # noqa: BLE001 - no cuda-bindings, or no libnvrtc: TVM says which
            return None
        return f"nvrtc {major}.{minor}"
    try:
        done = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{mode} {done.stdout.strip()}"


@functools.cache
def _toolkit() -> str:
    """The CUDA toolkit whose headers the source includes: its folder and full version."""
    from tvm.support import nvcc  # noqa: PLC0415

    try:
        path = nvcc.find_cuda_path()
        return f"{path} {nvcc.get_cuda_version(path)}"
    except (RuntimeError, OSError, StopIteration, ValueError):
        return "none"


def entry_path(key: str) -> Path:
    """Where the entry of ``key`` (a hex digest, so the name stays inside the folder) lives."""
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise ValueError(f"not a cache key: {key!r}")
    return env.KERNEL_CACHE / "cuda" / f"{key}.bin"


def _read(key: str) -> bytes | None:
    path = entry_path(key)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        log.warning("cannot read the kernel cache entry %s (%s); compiling it again", path,
                    err.strerror or err)
        return None
    head = len(MAGIC) + 65  # the magic line, then the binary's SHA-256 in hex and a newline
    binary = data[head:]
    if (not data.startswith(MAGIC) or data[head - 1:head] != b"\n"
            or hashlib.sha256(binary).hexdigest().encode() != data[len(MAGIC):head - 1]):
        log.warning("ignoring the corrupt kernel cache entry %s; compiling it again", path)
        return None
    return binary


def _write(key: str, binary: bytes) -> None:
    """Store ``binary`` under ``key``: a temporary file in the cache folder, renamed into place.
    A cache that cannot be written (read-only, full) costs a warning, not the build."""
    path = entry_path(key)
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".partial")
        with os.fdopen(fd, "wb") as out:
            out.write(MAGIC + hashlib.sha256(binary).hexdigest().encode() + b"\n" + binary)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
        temporary = None
    except OSError as err:
        log.warning("cannot write the kernel cache %s (%s); going on without it", path.parent,
                    err.strerror or err)
    finally:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
