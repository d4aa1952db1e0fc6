"""Shared fixtures: tiny models built once per session, and a way to run the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tvmfuse.targets import host_target_name

REPO = Path(__file__).resolve().parent.parent

#: The target whose libraries run on this machine (``avx512``, ``avx2``, ...): what the tests that
#: run what they build compile for. Tests of one target's own schedules name that target.
HOST = host_target_name()

# The user's own tuning databases (where `tvmfuse tune` writes, applied by every build over the
# shipped ones) live in a folder of this test run: a developer's tuning must not change what the
# tests build, nor the tests write into it. Set before tvmfuse is imported (tvmfuse.env reads it).
os.environ["TVMFUSE_TUNING_LOGS"] = tempfile.mkdtemp(prefix="tvmfuse-test-tuning-logs-")
# Likewise the kernel cache: the tests neither read a developer's CUDA binaries nor add theirs.
os.environ["TVMFUSE_KERNEL_CACHE"] = tempfile.mkdtemp(prefix="tvmfuse-test-kernels-")


@pytest.fixture(scope="session")
def build_tiny(tmp_path_factory):
    """Build a zoo/tiny model once per (model, target, dynamic) and return (imported, folder)."""
    from tvmfuse import api

    cache = {}

    def build(source: str, target: str = HOST, dynamic: tuple[str, ...] = (), **options):
        key = (source, target, dynamic, tuple(sorted(options.items())))
        if key not in cache:
            model = api.import_model(source, dynamic=dynamic)
            folder = tmp_path_factory.mktemp("build")
            compiled = api.compile_model(model, api.get_target(target), api.BuildOptions(**options))
            cache[key] = (model, api.build(compiled, folder / "out"))
        return cache[key]

    return build


def relax_main(params: dict[str, tuple], body, dtype: str = "float32"):
    """A Relax module whose ``main`` takes tensors ``params`` (name -> shape, all ``dtype``) and
    returns ``body(bb, *params)``, computed in one dataflow block: the Before/After modules of the
    pass tests."""
    from tvm import relax

    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, dtype)) for name, shape in params.items()]
    with bb.function("main", args):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *args))
        bb.emit_func_output(out)
    return bb.get()


def run_cli(*args: str, cwd: Path | None = None, code: str | None = None):
    """Run ``tvmfuse ARGS`` in a fresh interpreter; return the CompletedProcess (text)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "tvmfuse", *args] if code is None else [sys.executable, "-c", code]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd or REPO, env=env,
                          timeout=600)


def build_cuda_kernel(kernel, target):
    """Compile ``kernel`` (a schedule's one PrimFunc, or a PrimFunc written scheduled) for the
    CUDA ``target`` as tvmfuse's CUDA builds lower it (``cp.async`` on)."""
    import tvm  # noqa: PLC0415 - only the CUDA schedule tests need it here
    from tvm import s_tir  # noqa: PLC0415

    func = kernel.mod["main"] if isinstance(kernel, s_tir.Schedule) else kernel
    with target, tvm.transform.PassContext(config={"tirx.use_async_copy": True}):
        return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                           target=target)


def cuda_source(kernel, target) -> str:
    """The CUDA source of :func:`build_cuda_kernel`'s library."""
    lib = build_cuda_kernel(kernel, target)
    return lib.mod.imports[0].inspect_source() if lib.mod.imports else lib.mod.inspect_source()


def nvcc_compiles(source: str, folder: Path, arch: str = "sm_90") -> None:
    """Compile CUDA ``source`` for ``arch`` (sm_90a: wgmma's) with nvcc in ``folder`` (the test
    fails with nvcc's error); skip the test where nvcc is not installed."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed: CUDA source generated but not compiled")
    (folder / "k.cu").write_text(source)
    # -gencode, not -arch: nvcc -arch=sm_90a -c also assembles compute_90 PTX, without wgmma
    done = subprocess.run(["nvcc", f"-gencode=arch=compute_{arch[3:]},code={arch}", "-c", "-w",
                           str(folder / "k.cu"), "-o", str(folder / "k.o")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def database_record(workload: int, seconds: float, target: dict | None = None,
                    trace: str = "t") -> list:
    """A tuning record line (as MetaSchedule's JSON database stores it) of ``workload``, timed at
    ``seconds``, for ``target``'s config (default: this host's)."""
    from tvmfuse import api

    config = api.get_target(HOST).config if target is None else target
    return [workload, [[[trace]], [seconds], dict(config), []]]


def write_database(folder: Path, workloads, records, extra_record_lines=()) -> Path:
    """A database folder holding ``workloads`` (indices) and ``records``, plus raw lines."""
    import json

    from tvmfuse.tuning import database

    folder.mkdir(parents=True, exist_ok=True)
    (folder / database.WORKLOADS).write_text(
        "".join(json.dumps([f"h{w}", f"workload-{w}"]) + "\n" for w in workloads))
    lines = [json.dumps(r) for r in records] + list(extra_record_lines)
    (folder / database.RECORDS).write_text("".join(line + "\n" for line in lines))
    return folder
