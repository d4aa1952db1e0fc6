"""Fault injection on the command line (issue #19's list): damaged build folders, failed
verifications next to a good build, bad factories, inputs and arguments. Each ends in one error
line naming the fix and exit code 2, never a traceback; an earlier build is never replaced by a
failed one; argument errors are found before torch or TVM is imported."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import HOST, run_cli

#: TVM's C++ warnings go straight to stderr ("[11:21:22] /project/src/...: Warning: ..."): not
#: ours to format, and not errors.
_TVM_NATIVE = re.compile(r"^\[\d\d:\d\d:\d\d\] \S+\.cc:\d+: ")


def _one_error_line(result, pattern: str) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines()
             if line.strip() and " INFO " not in line and " WARNING " not in line
             and not _TVM_NATIVE.match(line)]
    assert len(lines) == 1, result.stderr
    assert "ERROR" in lines[0] and pattern in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("faults") / "good"
    result = run_cli("build", "tiny-resnet", "-o", str(folder))
    assert result.returncode == 0, result.stderr
    return folder


def _damage(folder: Path, how: str) -> None:
    so, check = folder / "model.so", folder / "check.npz"
    if how == "truncated model.so":
        with open(so, "r+b") as f:
            f.truncate(so.stat().st_size // 3)
    elif how == "garbage model.so":
        size = so.stat().st_size  # as large as the library: the digest, not the size, tells
        so.write_bytes((bytes(range(256)) * (size // 256 + 1))[:size])
    elif how == "deleted model.so":
        so.unlink()
    elif how == "truncated check.npz":
        with open(check, "r+b") as f:
            f.truncate(check.stat().st_size // 2)
    elif how == "garbage check.npz":
        check.write_bytes(b"PK\x03\x04" + b"g" * (check.stat().st_size - 4))
    elif how == "garbage manifest.json":
        (folder / "manifest.json").write_text("{")
    elif how == "truncated model.so, manifest without digests":
        manifest = json.loads((folder / "manifest.json").read_text())
        del manifest["files"]
        (folder / "manifest.json").write_text(json.dumps(manifest))
        _damage(folder, "truncated model.so")


@pytest.mark.parametrize(("how", "message"), [
    ("truncated model.so", "model.so is truncated since it was built"),
    ("garbage model.so", "model.so is overwritten since it was built"),
    ("deleted model.so", "has no model.so; rebuild the model"),
    ("truncated check.npz", "check.npz is damaged"),
    ("garbage check.npz", "check.npz is damaged"),
    ("garbage manifest.json", "manifest.json is damaged"),
    # mapping a truncated library kills the process with SIGBUS: an older build is checked too
    ("truncated model.so, manifest without digests", "is not a whole shared library"),
])
def test_a_damaged_build_is_one_error_line(good, tmp_path, how, message):
    folder = tmp_path / "build"
    shutil.copytree(good, folder)
    _damage(folder, how)
    _one_error_line(run_cli("run", str(folder), "--check"), message)


def test_a_failed_verify_leaves_the_earlier_build(good, tmp_path):
    folder = tmp_path / "build"
    shutil.copytree(good, folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    _one_error_line(run_cli("build", "tiny-resnet", "--target", "arm64", "--verify", "-o",
                            str(folder)), "cannot verify a arm64 build here")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_build_whose_check_fails_is_never_swapped_in(good, tmp_path):
    from tvmfuse import TvmfuseError, api

    folder = tmp_path / "build"
    shutil.copytree(good, folder)
    before = (folder / "manifest.json").read_bytes()
    compiled = api.compile_model(api.import_model("tiny-resnet"), api.get_target(HOST),
                                 api.BuildOptions())

    def fails(staged: Path):
        assert (staged / "model.so").is_file()  # checked whole, before the swap
        raise TvmfuseError("output differs")

    with pytest.raises(TvmfuseError, match="output differs"):
        api.build(compiled, folder, check=fails)
    assert (folder / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build"]


#: What a full disk raises while a build is written: the linker through TVM (its RuntimeError,
#: as g++ failing to write model.so says it), a linker run by subprocess, a write of the
#: manifest or check.npz (an OSError without a file name, as numpy's archive writes raise it).
_LINKER_SAYS = "/usr/bin/ld: final link failed: No space left on device"
DISK_FULL = {
    "tvm link": RuntimeError(f"Compilation error:\n{_LINKER_SAYS}\ncollect2: error: ld "
                             "returned 1 exit status\n\nCommand line: /usr/bin/g++ -shared"),
    "subprocess link": subprocess.CalledProcessError(1, ["g++"], output=_LINKER_SAYS.encode()),
    "write": OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
}


@pytest.mark.parametrize("how", DISK_FULL)
def test_a_full_disk_during_build_is_one_line_and_changes_nothing(good, tmp_path, monkeypatch,
                                                                   caplog, capsys, how):
    from tvmfuse.cli import main
    from tvmfuse.targets import TargetSpec

    folder = tmp_path / "build"
    shutil.copytree(good, folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def export(self, executable, path):
        Path(path).write_bytes(b"\x7fELF half a library")  # what a failed write leaves
        raise DISK_FULL[how]

    monkeypatch.setattr(TargetSpec, "export", export)
    with caplog.at_level(logging.INFO):
        # --no-cache: the same build as the folder's, compiled again rather than kept
        assert main(["build", "tiny-resnet", "-o", str(folder), "--no-cache"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [f"cannot write the build {folder}: No space left on device (nothing was "
                      f"changed there); free space on its disk or choose another -o"]
    assert "Traceback" not in caplog.text + "".join(capsys.readouterr())
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build"]  # no staging folder left


def test_a_build_onto_a_full_disk_is_one_line_and_changes_nothing(good, tmp_path):
    """The real thing: a 2 MiB tmpfs holding an earlier build, filled but for 16 KiB; g++ fails
    to write model.so."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here to make a small disk")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        shutil.copytree(good, disk / "build")
        before = {p.name: p.read_bytes() for p in (disk / "build").iterdir()}
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        (disk / "filler").write_bytes(bytes(free - 16 * 1024))
        result = run_cli("build", "tiny-resnet", "-o", str(disk / "build"), "--no-cache")
        _one_error_line(result, f"cannot write the build {disk / 'build'}: No space left on "
                                f"device")
        assert {p.name: p.read_bytes() for p in (disk / "build").iterdir()} == before
        assert sorted(p.name for p in disk.iterdir()) == ["build", "filler"]
    finally:
        subprocess.run(["umount", str(disk)], check=True)


FACTORIES = textwrap.dedent("""
    import torch

    def raises():
        raise RuntimeError("no weights here")

    def kwargs():
        return torch.nn.Linear(8, 8), {"input": torch.randn(1, 8)}

    def zeros():
        class Zeros(torch.nn.Module):
            def forward(self, x):
                return x * 0.0
        return Zeros(), (torch.randn(1, 8),)

    def patches():
        class Patches(torch.nn.Module):
            def forward(self, x):
                return torch.nn.functional.fold(x, (4, 4), 2)
        return Patches(), (torch.randn(1, 12, 9),)
""")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "factories.py").write_text(FACTORIES)
    (folder / "syntax.py").write_text("def f(:\n")
    (folder / "bad.pt2").write_bytes(b"not a zip" * 100)
    (folder / "a-file").write_text("")
    (folder / "bad.toml").write_text("[default\n")
    (folder / "unknown.toml").write_text("[default]\nno_such_rule = { enabled = false }\n")
    import torch

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    torch.onnx.export(net, (torch.randn(1, 3, 16, 16),), str(folder / "m.onnx"), dynamo=False,
                      opset_version=17)
    return folder


@pytest.mark.parametrize(("args", "message"), [
    (["build", "factories.py:raises", "-o", "o"], "raised RuntimeError: no weights here"),
    (["build", "factories.py:kwargs", "-o", "o"],
     "returned example inputs holding a dict, not tensors"),
    (["build", "syntax.py:f", "-o", "o"], "SyntaxError: invalid syntax"),
    (["build", "tiny-resnet", "--input-shape", "1,3,32,32:float16", "-o", "o"],
     "cannot run on inputs x(1, 3, 32, 32):float16"),
    (["build", "m.onnx", "--input-shape", "2,5,16,16", "-o", "o"],
     "TVM cannot import m.onnx (operator Conv)"),
    (["build", "bad.pt2", "-o", "o"], "cannot load exported program bad.pt2"),
    (["build", "factories.py:patches", "--dynamic", "batch", "-o", "o"],
     "phase 1 (fold) failed: Cannot broadcast index shapes"),  # F.fold, a symbolic batch
    (["build", "tiny-resnet", "--dynamic", "seq", "--max-seq", "64", "-o", "o"],
     "--dynamic seq: tiny-resnet has no token inputs"),
])
def test_a_bad_model_is_one_error_line(files, args, message):
    _one_error_line(run_cli(*args, cwd=files), message)


#: Errors in the arguments alone: found before torch and TVM are imported.
ARGUMENT_ERRORS = [
    (["build", "tiny-resnet", "-o", "a-file"], "a-file is a file, not a folder"),
    (["build", "tiny-resnet", "-o", "o", "--dump-ir", "a-file"], "--dump-ir a-file is a file"),
    (["build", "nothing.py:f", "-o", "o"], "no file nothing.py"),
    (["build", "tiny-transformer", "--dynamic", "seq", "-o", "o"],
     "--dynamic seq needs --max-seq N"),
    (["build", "tiny-transformer", "--max-seq", "64", "-o", "o"],
     "--max-seq bounds a dynamic sequence: add --dynamic seq"),
    (["build", "tiny-resnet", "--target", "sparc", "-o", "o"], "unknown target 'sparc'"),
    (["build", "tiny-resnet", "--input-shape", "1,a", "-o", "o"], "cannot read input shape"),
    (["build", "tiny-resnet", "--db", "no-such-db", "-o", "o"], "no-such-db does not exist"),
    (["build", "tiny-resnet", "--verify", "--rpc", "127.0.0.1:1:k", "-o", "o"],
     "no RPC tracker at 127.0.0.1:1"),
    (["tune", "tiny-resnet", "--budget", "nan"], "'nan' is not a duration"),
    (["tune", "tiny-resnet", "--budget=-5m"], "'-5m' is not a duration"),
    (["tune", "tiny-resnet", "--rpc", "127.0.0.1:1:k"], "no RPC tracker at 127.0.0.1:1"),
    (["run", "o", "--random", "--repeat", "-5"], "'-5' is not a whole number of at least 0"),
    (["run", "o", "--random", "-o", "out.txt"], "outputs are written as .npz"),
    (["bench", "tiny-resnet", "--threads", "0"], "'0' is not a whole number of at least 1"),
    (["bench", "tiny-resnet", "--max-seconds", "-1"], "'-1' is not a number above 0"),
    (["bench", "tiny-resnet", "--engines", "tvmfuse,tensorrt"], "unknown engine 'tensorrt'"),
    (["db", "purge", "no-such-db"], "no-such-db does not exist"),
    (["db", "check", "no-such-db"], "no-such-db does not exist"),
    (["build", "tiny-resnet", "--input-shape", "99999999999,8", "-o", "o"],
     "GiB, more than this machine's memory"),
    (["bench", "tiny-resnet", "--json", "/nonexistent/x.json"],
     "--json /nonexistent/x.json: folder /nonexistent does not exist"),
    (["bench", "tiny-resnet", "--json", "."], "--json . is a folder"),
    (["tune", "tiny-resnet", "--fusion-rules", "bad.toml"], "fusion rules bad.toml are not valid"),
    (["tune", "tiny-resnet", "--db", "a-file/db"], "--db a-file/db: cannot write into a-file"),
    (["build", "tiny-resnet", "--fusion-rules", "unknown.toml", "-o", "o"],
     "unknown rule 'no_such_rule'"),
]


@pytest.mark.parametrize(("args", "message"), ARGUMENT_ERRORS)
def test_an_argument_error_is_one_line_before_any_heavy_import(files, args, message):
    _one_error_line(_main_before_heavy_imports(args, files), message)
    assert not (files / "o").exists()  # nothing was built or created
    if args[:2] == ["db", "purge"]:
        assert not (files / "no-such-db").exists()


def test_a_build_into_the_current_folder_is_refused_before_compiling(good, tmp_path):
    folder = tmp_path / "build"
    shutil.copytree(good, folder)  # a build folder: `-o .` there would replace it from inside
    before = sorted(p.name for p in tmp_path.iterdir())
    for out in (".", ".."):
        _one_error_line(_main_before_heavy_imports(["build", "tiny-resnet", "-o", out], folder),
                        f"-o {out} is the current folder or one above it")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_npy_header_claiming_terabytes_is_refused_before_allocating(good, tmp_path):
    huge = tmp_path / "huge.npy"
    with open(huge, "wb") as f:  # 3.5 TiB claimed, a few bytes held
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (1, 3, 1000000, 322122)})
        f.write(b"\0" * 64)
    result = run_cli("run", str(good), "--input", str(huge), "-o", str(tmp_path / "o.npz"))
    _one_error_line(result, "claims 3,865,464,000,000 bytes")
    archive = tmp_path / "huge.npz"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(huge, "x.npy")
    result = run_cli("run", str(good), "--input", str(archive), "-o", str(tmp_path / "o.npz"))
    _one_error_line(result, "the file is damaged")


def _main_before_heavy_imports(args: list[str], cwd: Path):
    """Run ``tvmfuse args`` in ``cwd``, asserting that it returns before torch or TVM is
    imported."""
    code = textwrap.dedent(f"""
        import sys
        from tvmfuse.cli import main
        try:
            rc = main({args!r})
        except SystemExit as stop:  # argparse's own errors
            rc = stop.code
        heavy = sorted(m for m in ("torch", "tvm") if sys.modules.get(m) is not None)
        assert not heavy, f"imported {{heavy}} before reporting the error"
        sys.exit(rc)
    """)
    return run_cli(code=code, cwd=cwd)


def test_tune_refuses_tuning_logs_it_cannot_write_before_start_up(files):
    code = textwrap.dedent("""
        import os, sys
        os.environ["TVMFUSE_TUNING_LOGS"] = "a-file"
        from tvmfuse.cli import main
        rc = main(["tune", "tiny-resnet"])
        heavy = sorted(m for m in ("torch", "tvm") if sys.modules.get(m) is not None)
        assert not heavy, f"imported {heavy} before reporting the error"
        sys.exit(rc)
    """)
    _one_error_line(run_cli(code=code, cwd=files), "TVMFUSE_TUNING_LOGS a-file is a file")


def test_run_writes_into_a_folder_it_is_given(good, tmp_path):
    result = run_cli("run", str(good), "--random", "-o", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "outputs.npz").is_file() and not Path(f"{tmp_path}.npz").exists()


def test_verify_warns_when_the_reference_output_is_constant(files, tmp_path):
    result = run_cli("build", "factories.py:zeros", "-o", str(tmp_path / "z"), "--verify",
                     cwd=files)
    assert result.returncode == 0, result.stderr
    assert "is the constant 0.0 on these inputs" in result.stderr


def test_a_light_module_set_serves_the_cli_and_the_deployment_path():
    """What must stay light (lazy imports are kept there, and only there): the CLI's modules,
    the runtime and its checks, the build folder's writer, the databases and the engine table."""
    code = textwrap.dedent("""
        import sys
        import tvmfuse.artifact, tvmfuse.bench.engines, tvmfuse.bench.measure, tvmfuse.cli
        import tvmfuse.remote, tvmfuse.runtime, tvmfuse.tuning.database, tvmfuse.tuning.lookup
        import tvmfuse.verify
        heavy = sorted(m for m in ("torch", "tvm") if m in sys.modules)
        assert not heavy, heavy
    """)
    result = run_cli(code=code)
    assert result.returncode == 0, result.stderr
    assert sys.version_info >= (3, 11)
