"""Named targets: each maps to a TVM target dict, a linker and a stable key for ``tuning_logs/``.

The key names the folder of the target's tuning database, so it must change exactly when records
stop being valid: it carries the CPU model for host targets, whose records depend on it.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
from dataclasses import dataclass, field
from typing import Any

from .errors import TvmfuseError

#: Limits MetaSchedule needs spelled out for sm_90 (H100/H200); without them it refuses the target.
_CUDA_SM90 = {
    "kind": "cuda",
    "arch": "sm_90",
    "max_threads_per_block": 1024,
    "max_shared_memory_per_block": 49152,
    "thread_warp_size": 32,
    "registers_per_block": 65536,
}


@dataclass(frozen=True)
class GpuFacts:
    """A CUDA GPU as the hand-written kernels of ``schedules/cuda/`` size themselves for: tiles
    that fill whole waves of SMs, pipelines that fit a block's shared memory, a register file
    split between warpgroups, row reductions spread over a cluster's blocks."""

    #: Streaming multiprocessors (``cudaDevAttrMultiProcessorCount``).
    sm_count: int
    #: Shared memory one thread block may opt in to, in bytes
    #: (``cudaDevAttrMaxSharedMemoryPerBlockOptin``).
    shared_memory_per_block: int
    #: 32-bit registers of one SM (``cudaDevAttrMaxRegistersPerMultiprocessor``).
    registers_per_sm: int
    #: Thread blocks a cluster may hold at the portable size (sm_90 and later; 1 before).
    max_cluster_size: int


#: Hopper, sm_90: H100 SXM and H200 alike (132 SMs, 227 KiB of shared memory a block, 64 Ki
#: registers an SM, clusters of up to 8 blocks without the non-portable opt-in).
SM90_GPU = GpuFacts(sm_count=132, shared_memory_per_block=227 * 1024, registers_per_sm=65536,
                    max_cluster_size=8)


@dataclass(frozen=True)
class Vector:
    """A CPU core as the hand-written schedules see it: its vector unit and its L2 cache."""

    #: float32 lanes of one vector register (AVX-512: 16, SSE and NEON: 4).
    lanes: int
    #: Architectural vector registers (AVX-512 and NEON: 32, SSE: 16).
    registers: int
    #: LLVM's name of the core (``znver5``), where a schedule's choices depend on it; "" if not.
    core: str = ""
    #: Bytes of L2 cache each core has (the host's read from sysfs, a named core's from
    #: ``_L2_BYTES``; 1 MiB where unknown). GEMM tiles size their weight panels by it.
    l2_bytes: int = 1 << 20
    #: Whether one instruction adds the products of bf16 pairs into float32 lanes (AVX-512
    #: BF16's ``vdpbf16ps``, as LLVM's CPU model says): a bf16 build's GEMMs and convs use it.
    dot_bf16: bool = False
    #: Whether one instruction adds the products of four uint8 x int8 pairs into int32 lanes
    #: (AVX-512 VNNI's ``vpdpbusd``): an int8 build's GEMMs and convs use it.
    dot_int8: bool = False


#: L2 cache per core of the CPUs tvmfuse names (LLVM's names), from the vendors' data sheets; a
#: target for a named CPU uses these, not the machine it is built on.
_L2_BYTES = {
    "znver3": 512 << 10, "znver4": 1 << 20, "znver5": 1 << 20,
    "skylake-avx512": 1 << 20, "icelake-server": 1280 << 10,
    "sapphirerapids": 2 << 20, "emeraldrapids": 2 << 20, "graniterapids": 2 << 20,
    "cortex-a76": 512 << 10, "neoverse-n1": 1 << 20,
}


#: Blobs from this size on go to x86-64's large read-only section, as TVM's own packing puts them:
#: a reference to the default ``.rodata`` past 2 GiB does not link ("relocation truncated to fit").
_LARGE_BLOB_BYTES = 1 << 30


def pack_imports_as_object(module, is_system_lib: bool, symbol_prefix: str, workspace: str, *,
                           arch: str) -> str:
    """TVM's ``fpack_imports`` for ``export_library``: the bytes TVM packs its imported modules
    into (the VM's code and constants, hence every weight; CUDA binaries) written straight into
    an ELF object under TVM's symbol (:mod:`tvmfuse.elf`), which the linker takes with the
    kernels. TVM's default makes them one LLVM constant and emits it, seconds per hundred MB; an
    assembler's ``.incbin`` of them took 1.4 s more than this for BERT-base's 437 MB (``python
    benchmarks/build_time.py``: the ``export`` stage)."""
    import numpy as np  # noqa: PLC0415
    from tvm.runtime import _ffi_api  # noqa: PLC0415

    from .elf import write_data_object  # noqa: PLC0415

    if is_system_lib or symbol_prefix:
        raise TvmfuseError("tvmfuse builds shared libraries, not system libraries")
    blob = np.from_dlpack(_ffi_api.ModulePackImportsToTensor(module))
    large = arch == "x86_64" and blob.nbytes >= _LARGE_BLOB_BYTES
    path = os.path.join(workspace, "devc.o")
    write_data_object(path, blob, _ffi_api.ModuleImportsBlobName(), arch,
                      section=".lrodata" if large else ".rodata")
    return path


@dataclass(frozen=True)
class TargetSpec:
    """A named compilation target.

    Attributes
    ----------
    name : str
        What the user types (``--target avx512``).
    key : str
        Stable folder name of this target's tuning database under ``tuning_logs/``.
    config : dict
        The TVM target dict.
    device : str
        ``"cpu"`` or ``"cuda"``: where the built library runs.
    arch : str
        Machine architecture the library runs on (``uname -m`` spelling).
    cross_cc : str or None
        Cross linker for ``export_library``; None links with the host compiler.
    cpu_flags : tuple of str
        CPU features the library needs at run time (checked before running here).
    vector : Vector or None
        The vector unit CPU schedules block for; None on GPUs.
    gpu : GpuFacts or None
        The GPU the CUDA schedules size their kernels for; None on CPUs.
    rules_section : str
        The section of the fusion rules file that overrides the defaults for this target.
    """

    name: str
    key: str
    config: dict[str, Any]
    device: str
    arch: str
    description: str
    rules_section: str
    cross_cc: str | None = None
    cpu_flags: tuple[str, ...] = field(default=())
    vector: Vector | None = None
    gpu: GpuFacts | None = None

    def tvm_target(self):
        """The TVM target of ``config``, built once per TargetSpec and shared by everything that
        compiles for it (the pipeline's phases, the strategy, tuning)."""
        return self._tvm_target

    @functools.cached_property
    def _tvm_target(self):
        import tvm  # noqa: PLC0415 - keep `import tvmfuse` light

        return tvm.target.Target(self.config)

    def export(self, executable, path: str) -> None:
        """Write ``executable`` as a shared library, cross-linking when the target needs it; the
        modules it imports (the VM's code and weights, CUDA binaries) go in by
        :func:`pack_imports_as_object`."""
        fcompile = None
        if self.cross_cc is not None:
            if shutil.which(self.cross_cc) is None:
                raise TvmfuseError(
                    f"target {self.name} links with {self.cross_cc}, which is not installed; "
                    f"install it (Debian: apt-get install g++-aarch64-linux-gnu, or "
                    f"`make sysdeps`)")
            from tvm.support import cc  # noqa: PLC0415

            fcompile = cc.cross_compiler(self.cross_cc)
        pack = functools.partial(pack_imports_as_object, arch=self.arch)
        executable.export_library(path, fcompile=fcompile, fpack_imports=pack)

    @property
    def is_gpu(self) -> bool:
        return self.device == "cuda"

    def device_here(self):
        """The TVM device a library for this target runs on in this process."""
        import tvm  # noqa: PLC0415

        return tvm.device(self.device, 0)

    def device_of(self, session):
        """The device a library for this target runs on in an RPC ``session``."""
        return session.device(self.device, 0)

    def relax_backend(self):
        """TVM's Relax pipeline module for this target (see :func:`relax_backend`)."""
        return relax_backend(self.config["kind"])

    def why_not_runnable(self) -> str | None:
        """Why a library for this target cannot run on this machine, or None when it can."""
        if self.is_gpu:
            return None if self.device_here().exist else "this machine has no CUDA GPU"
        if self.arch != platform.machine():
            return f"it is built for {self.arch} and this machine is {platform.machine()}"
        missing = [f for f in self.cpu_flags if f not in _host_cpu_flags()]
        if missing:
            return f"this CPU lacks {', '.join(missing)}"
        return None


def relax_backend(kind: str):
    """TVM's per-target Relax pipeline module for a target of ``kind`` ("llvm", "cuda"):
    ``relax/backend/<family>/pipeline.py``, with its legalize, lowering and finalize passes.
    0.27's ``relax.pipeline`` dispatcher misses cpu_generic's, so tvmfuse picks the module."""
    if kind == "cuda":
        from tvm.relax.backend.cuda import pipeline  # noqa: PLC0415 - keep `import tvmfuse` light
    else:
        from tvm.relax.backend.cpu_generic import pipeline  # noqa: PLC0415
    return pipeline


@functools.cache
def _host_cpuinfo() -> dict[str, str] | None:
    """The first processor's fields in /proc/cpuinfo (``flags``, ``model``, ...); None where
    there is no /proc/cpuinfo (not Linux)."""
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the end of the first processor's block
                field, _, value = line.partition(":")
                fields[field.strip()] = value.strip()
    except OSError:
        return None
    return fields


def _host_cpu_flags() -> frozenset[str]:
    return frozenset((_host_cpuinfo() or {}).get("flags", "").split())


@functools.cache
def _host_l2_bytes() -> int | None:
    """This machine's L2 cache per core, from sysfs (``cpu0/cache/index*``); None where it does
    not say (not Linux, or a hypervisor that hides the caches)."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        indexes = os.listdir(root)
    except OSError:
        return None
    for index in sorted(indexes):
        try:
            with open(f"{root}/{index}/level", encoding="ascii") as f:
                level = f.read().strip()
            with open(f"{root}/{index}/type", encoding="ascii") as f:
                kind = f.read().strip()
            with open(f"{root}/{index}/size", encoding="ascii") as f:
                size = f.read().strip()
        except OSError:
            continue
        digits = size.rstrip("KMG")
        shift = {"": 0, "K": 10, "M": 20, "G": 30}.get(size[len(digits):])
        if level == "2" and kind in ("Unified", "Data") and digits.isdigit() and shift is not None:
            return int(digits) << shift
    return None


def _l2_bytes(cpu: str, here: bool) -> int:
    """L2 per core of ``cpu``: this machine's where ``here`` (the target is this host's own
    CPU), else from ``_L2_BYTES``; 1 MiB where neither knows."""
    known = _host_l2_bytes() if here else None
    return known or _L2_BYTES.get(cpu, 1 << 20)


def _host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _host_cpu() -> str:
    from tvm.target import codegen  # noqa: PLC0415

    return codegen.llvm_get_system_cpu()


def _llvm_has(cpu: str, feature: str) -> bool:
    """Whether LLVM's model of the CPU ``cpu`` has ``feature`` (``avx512bf16``)."""
    import tvm  # noqa: PLC0415 - keep `import tvmfuse` light

    return bool(tvm.target.codegen.target_has_features(
        feature, tvm.target.Target({"kind": "llvm", "mcpu": cpu})))


def _avx512(cpu: str | None = None) -> TargetSpec:
    # On a host without AVX-512 the library still builds (for deployment elsewhere) for a
    # generic AVX-512 core; it just cannot run here.
    here = cpu is None and "avx512f" in _host_cpu_flags()
    if cpu is None:
        cpu = _host_cpu() if here else "skylake-avx512"
    return TargetSpec(
        name="avx512",
        key=f"avx512-{cpu}",
        config={"kind": "llvm", "mcpu": cpu, "num-cores": _host_cores()},
        device="cpu",
        arch="x86_64",
        description=f"this host's x86-64 CPU with AVX-512 ({cpu}, {_host_cores()} cores)",
        rules_section="avx512",
        cpu_flags=("avx512f",),
        vector=Vector(lanes=16, registers=32, core=cpu, l2_bytes=_l2_bytes(cpu, here),
                      dot_bf16=_llvm_has(cpu, "avx512bf16"),
                      dot_int8=_llvm_has(cpu, "avx512vnni")),
    )


def _avx2() -> TargetSpec:
    # AVX2 + FMA (x86-64 cores without AVX-512): eight float32 lanes and sixteen registers. On an
    # AVX-512 host the host's CPU with AVX-512 switched off, so that the library runs there and
    # its tuning records name the machine that measured them; without AVX2, a generic Haswell.
    flags = _host_cpu_flags()
    here = {"avx2", "fma"} <= flags
    cpu = _host_cpu() if here else "haswell"
    mattr = {"mattr": ["-avx512f"]} if "avx512f" in flags else {}
    return TargetSpec(
        name="avx2",
        key=f"avx2-{cpu}",
        config={"kind": "llvm", "mcpu": cpu, **mattr, "num-cores": _host_cores()},
        device="cpu",
        arch="x86_64",
        description=f"an x86-64 CPU with AVX2 and FMA ({cpu}, {_host_cores()} cores)",
        rules_section="avx2",
        cpu_flags=("avx2", "fma"),
        vector=Vector(lanes=8, registers=16, l2_bytes=_l2_bytes(cpu, here)),
    )


def _x86_64() -> TargetSpec:
    return TargetSpec(
        name="x86-64",
        key="x86-64",
        config={"kind": "llvm", "mcpu": "x86-64", "num-cores": _host_cores()},
        device="cpu",
        arch="x86_64",
        description="any x86-64 CPU (SSE2 only)",
        rules_section="x86-64",
        vector=Vector(lanes=4, registers=16),
    )


#: Named aarch64 cores: target name -> (LLVM mcpu, features beyond NEON, what it is).
_ARM_CORES = {
    "arm64": ("generic", (), "any 64-bit ARM Linux core with NEON"),
    "arm64-a72": ("cortex-a72", ("+crc",), "Cortex-A72 (Raspberry Pi 4)"),
    "arm64-a76": ("cortex-a76", ("+dotprod",), "Cortex-A76 (Raspberry Pi 5)"),
    "arm64-n1": ("neoverse-n1", ("+dotprod",), "Neoverse-N1 (AWS Graviton2, Ampere Altra)"),
}
#: Cores the ARM targets assume (MetaSchedule needs a number; the runtime uses the board's own).
_ARM_CORES_ASSUMED = 4


def _arm64(name: str) -> TargetSpec:
    mcpu, features, what = _ARM_CORES[name]
    return TargetSpec(
        name=name,
        key="arm64-neon" if mcpu == "generic" else f"arm64-{mcpu}",
        config={"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": mcpu,
                "mattr": ["+neon", *features], "num-cores": _ARM_CORES_ASSUMED},
        device="cpu",
        arch="aarch64",
        description=f"{what}, cross-linked with aarch64-linux-gnu-g++",
        rules_section="arm64",
        cross_cc="aarch64-linux-gnu-g++",
        vector=Vector(lanes=4, registers=32, l2_bytes=_l2_bytes(mcpu, here=False)),
    )


def _cuda_sm90() -> TargetSpec:
    return TargetSpec(
        name="cuda-sm90",
        key="cuda-sm90",
        config={**_CUDA_SM90, "host": {"kind": "llvm", "mcpu": "x86-64"}},
        device="cuda",
        arch="x86_64",
        description="NVIDIA Hopper (H100/H200), CUDA source compiled when the library loads",
        rules_section="cuda",
        gpu=SM90_GPU,
    )


_TARGETS = {"avx512": _avx512, "avx2": _avx2, "x86-64": _x86_64,
            **{name: functools.partial(_arm64, name) for name in _ARM_CORES},
            "cuda-sm90": _cuda_sm90}


def avx512_for(cpu: str) -> TargetSpec:
    """The ``avx512`` target as it is on a host whose LLVM CPU is ``cpu`` (e.g. ``znver4``): what
    a committed ``tuning_logs/avx512-<cpu>/`` database was recorded for, whatever this host is."""
    return _avx512(cpu)


def host_target_name() -> str:
    """The target that makes the most of this machine's CPU: ``avx512`` where it has AVX-512,
    ``avx2`` where it has AVX2 and FMA, ``arm64`` on a 64-bit ARM, else ``x86-64``. What the
    command line builds for when no ``--target`` is given. Cheap (reads /proc/cpuinfo)."""
    if platform.machine() == "aarch64":
        return "arm64"
    flags = _host_cpu_flags()
    if "avx512f" in flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "x86-64"


def target_names() -> list[str]:
    return list(_TARGETS)


def check_name(name: str) -> str:
    """``name`` when it names a target, else a TvmfuseError listing the known names. Cheap (no
    TVM import): the CLI checks its arguments with it before loading anything heavy."""
    if name not in _TARGETS:
        raise TvmfuseError(f"unknown target {name!r}; choose one of: {', '.join(_TARGETS)}")
    return name


#: The targets whose spec names this host's CPU as LLVM does (asking LLVM imports TVM).
_HOST_CPU_TARGETS = ("avx512", "avx2")
#: The fields of /proc/cpuinfo that identify a CPU: the cpuid values LLVM's host-CPU detection
#: reads (vendor, family, model, stepping, feature flags).
_CPU_IDENTITY = ("vendor_id", "cpu family", "model", "stepping", "flags")


def fingerprint(name: str | None = None) -> tuple[str, str] | None:
    """What the spec of target ``name`` (default: this machine's) is made from, known without
    TVM, and the pattern its tuning database folders' names match: for avx512 and avx2, which
    take this host's CPU as LLVM names it, the CPU's identity in /proc/cpuinfo, its L2 and its
    cores, with ``NAME-*``; for the others their configuration and key. None where
    /proc/cpuinfo is not there. Equal fingerprints mean equal specs (the TVM version aside)."""
    name = check_name(name or host_target_name())
    if name not in _HOST_CPU_TARGETS:
        spec = get_target(name)
        return f"{name} {spec.config}", spec.key
    cpuinfo = _host_cpuinfo()
    if cpuinfo is None:
        return None
    identity = {field: cpuinfo.get(field) for field in _CPU_IDENTITY}
    return f"{name} {identity} l2={_host_l2_bytes()} cores={_host_cores()}", f"{name}-*"


def get_target(name: str | None = None) -> TargetSpec:
    """The named target, or a TvmfuseError listing the known names; without a name, this
    machine's own (:func:`host_target_name`)."""
    return _TARGETS[check_name(name or host_target_name())]()
