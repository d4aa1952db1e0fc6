"""Trust boundaries (issue #46): no code runs from a model or build file, nothing is written
outside the folder named (links included), one bad record never breaks a build or a database
command. Each case is a crafted file or link, and a check that the harm did not happen."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tvmfuse import api
from tvmfuse.errors import TvmfuseError
from tvmfuse.tuning import database

from conftest import HOST, run_cli
from conftest import database_record as _record
from conftest import write_database as _write

HOST_CONFIG = api.get_target(HOST).config


# --- a .pt2 file runs nothing --------------------------------------------------------------


class _WritesMarker:
    """A pickle that, when unpickled by pickle itself, writes ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    import torch

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 4)

        def forward(self, x):
            return torch.relu(self.linear(x))

    path = tmp_path_factory.mktemp("pt2") / "small.pt2"
    torch.export.save(torch.export.export(Small(), (torch.randn(2, 8),)), str(path))
    return path


def _with_member(source: Path, dest: Path, suffix: str, data: bytes) -> Path:
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(dest, "w") as out:
        for info in src.infolist():
            out.writestr(info, data if info.filename.endswith(suffix) else src.read(info))
    return dest


@pytest.mark.parametrize("member", ["data/sample_inputs/model.pt", "data/weights/weight_0"])
def test_a_pt2_whose_pickle_runs_code_is_refused_and_runs_nothing(exported, tmp_path, member):
    marker = tmp_path / "marker"
    evil = _with_member(exported, tmp_path / "evil.pt2", member,
                        pickle.dumps(_WritesMarker(marker)))
    if member.endswith("weight_0"):  # a pickled weight: torch.save's use_pickle path
        config = "data/weights/model_weights_config.json"
        with zipfile.ZipFile(evil) as archive:
            text = json.loads(archive.read(f"small/{config}"))
        for payload in text["config"].values():
            payload["use_pickle"] = True
        evil = _with_member(evil, tmp_path / "evil2.pt2", config, json.dumps(text).encode())
    with pytest.raises(TvmfuseError, match="would run code stored in the file"):
        api.import_model(str(evil))
    assert not marker.exists()


def test_a_normal_pt2_still_builds_and_runs(exported, build_tiny):
    model, folder = build_tiny(str(exported))
    with api.load(folder) as deployed:
        (out,) = deployed.run(model.example_inputs)
    np.testing.assert_allclose(out, model.reference(*model.example_inputs)[0], rtol=1e-4,
                               atol=1e-5)


# --- tuning databases: links, folders of other files, bad run times -----------------------


def test_purge_does_not_write_through_a_linked_quarantine(tmp_path):
    folder = _write(tmp_path / "db", [0], [_record(0, 0.001)], ["{broken"])
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    (folder / database.QUARANTINE).symlink_to(victim)
    purge = run_cli("db", "purge", str(folder))
    assert purge.returncode == 2 and "Traceback" not in purge.stderr, purge.stderr
    assert "is a symbolic link" in purge.stderr
    assert victim.read_text() == "keep\n"


@pytest.mark.parametrize("name", [".lock", f".{database.WORKLOADS}.new"])
def test_no_database_file_is_written_through_a_link(tmp_path, name):
    folder = _write(tmp_path / "db", [0], [_record(0, 0.001)])
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    (folder / name).symlink_to(victim)
    try:
        with database.locked(folder, create=False):
            database.write(database.read(folder))
    except TvmfuseError as err:
        assert name == ".lock" and "symbolic link" in str(err)
    else:  # a left-over .new file is removed (a link too), not written through
        assert name != ".lock" and len(database.read(folder).records) == 1
    assert victim.read_text() == "keep\n"


def test_recover_follows_no_link_to_another_folder(tmp_path):
    folder = _write(tmp_path / "db", [0], [_record(0, 0.001)])
    other = _write(tmp_path / "other", [7], [_record(0, 0.002, trace="other")])
    before = sorted(p.name for p in other.iterdir())
    (folder / f"{database.JOB_PREFIX}evil").symlink_to(other, target_is_directory=True)
    result = run_cli("db", "recover", str(folder), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["recovered"] == 0
    assert len(database.read(folder).records) == 1
    assert sorted(p.name for p in other.iterdir()) == before  # no .lock, no .owner there


def test_purge_refuses_a_folder_that_is_not_a_database_before_locking_it(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"x")
    purge = run_cli("db", "purge", str(folder))
    assert purge.returncode == 2 and "is not a tuning database" in purge.stderr, purge.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["a.jpg"]


def test_recover_quarantines_a_damaged_jobs_bad_lines(tmp_path):
    folder = _write(tmp_path / "db", [0], [_record(0, 0.001)])
    _write(folder / f"{database.JOB_PREFIX}dead", [1], [_record(0, 0.002)], ["{broken"])
    assert database.recover_jobs(folder) == 1
    assert database.quarantined(folder) == 1
    (kept,) = [json.loads(line) for line in (folder / database.QUARANTINE).open()]
    assert kept["text"] == "{broken" and kept["file"].endswith(database.RECORDS)


BAD_TIMES = ["NaN", "Infinity", "-Infinity", "-0.001", "0", "1e308"]


def _with_bad_time(folder: Path, seconds: str) -> Path:
    good = _record(0, 0.001)
    bad = json.dumps(_record(1, 0.5)).replace("[0.5]", f"[{seconds}]")
    return _write(folder, [0, 1], [good], [bad])


@pytest.mark.parametrize("seconds", BAD_TIMES)
def test_a_record_with_an_unmeasured_run_time_is_a_problem_everywhere(tmp_path, seconds):
    """check reports it, purge quarantines it, merge does not copy it, and a build's copy of
    the database leaves it out (MetaSchedule cannot read NaN; a negative time would win)."""
    folder = _with_bad_time(tmp_path / "db", seconds)
    db = database.read(folder)
    assert len(db.records) == 1 and "is not a measured time" in str(db.problems[0])
    merged = database.merge_folders([folder], tmp_path / "merged")
    assert merged.records == 1 and len(merged.skipped) == 1
    assert database.usable(folder, HOST_CONFIG, tmp_path / "scratch") == tmp_path / "scratch"
    assert len((tmp_path / "scratch" / database.RECORDS).read_text().splitlines()) == 1
    with database.locked(folder, create=False):
        db = database.read(folder)
        database.purge(db)
        database.write(db)
    assert database.quarantined(folder) == 1 and database.read(folder).sound


def test_db_check_and_purge_report_an_unmeasured_run_time(tmp_path):
    folder = _with_bad_time(tmp_path / "db", "NaN")
    check = run_cli("db", "check", str(folder))
    assert check.returncode == 1 and "is not a measured time" in check.stdout, check.stdout
    purge = run_cli("db", "purge", str(folder))
    assert purge.returncode == 0 and "corrupt lines kept in" in purge.stdout, purge.stderr
    # (the made-up workloads do not replay: check exits 1 on them, not on the run time)
    assert "is not a measured time" not in run_cli("db", "check", str(folder)).stdout


# --- build folders: what a manifest names stays inside, an edited one is one line --------


@pytest.fixture(scope="module")
def built(build_tiny) -> Path:
    return build_tiny("tiny-resnet")[1]


def _edit(folder: Path, how: str, tmp_path: Path, other: Path) -> None:
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    spec = manifest["inputs"][0]
    if how == "library ../elsewhere":
        other = tmp_path / "elsewhere"
        other.mkdir()
        (other / "model.so").write_bytes((folder / "model.so").read_bytes())
        manifest["library"] = "../elsewhere/model.so"
    elif how == "library absolute":
        manifest["library"] = str((folder / "model.so").resolve())
    elif how == "library /etc/passwd":
        manifest["library"] = "../../../../../../../../etc/passwd"
    elif how == "model.so a link out":
        outside = tmp_path / "outside.so"
        (folder / "model.so").rename(outside)
        (folder / "model.so").symlink_to(outside)
    elif how == "input shape":
        spec["shape"][-1] += 1
    elif how == "input dtype":
        spec["dtype"] = "float64"
    elif how == "unknown dtype":
        spec["dtype"] = "banana"
    elif how == "extra input":
        manifest["inputs"].append(dict(spec, name="extra"))
    elif how == "negative dimension":
        spec["shape"][-1] = -3
    elif how == "huge dimension":
        spec["shape"][-1] = 10**12
    elif how in ("another TVM library", "a non-TVM library"):
        if how == "another TVM library":  # a build of another model, digest updated
            library = other / "model.so"
        else:
            library = next(Path(np.__file__).parent.glob("**/_multiarray_umath*.so"))
        (folder / "model.so").write_bytes(library.read_bytes())
        from tvmfuse.runtime import file_digest

        manifest["files"]["model.so"] = file_digest(folder / "model.so")
    manifest_path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(("how", "message"), [
    ("library ../elsewhere", "which is not a file of the build folder"),
    ("library absolute", "which is not a file of the build folder"),
    ("library /etc/passwd", "which is not a file of the build folder"),
    ("model.so a link out", "which is not a file of the build folder"),
    ("input shape", "did not run on inputs its manifest describes"),
    ("input dtype", "did not run on inputs its manifest describes"),
    ("unknown dtype", "manifest.json is damaged"),
    ("extra input", "did not run on inputs its manifest describes"),
    ("negative dimension", "manifest.json is damaged"),
    ("huge dimension", "manifest.json is damaged"),
    ("another TVM library", "did not run on inputs its manifest describes"),
    ("a non-TVM library", "cannot load"),
])
def test_an_edited_build_folder_is_one_line_and_opens_nothing_outside(
        built, exported, build_tiny, tmp_path, how, message):
    from test_cli_faults import _one_error_line

    folder = tmp_path / "build"
    shutil.copytree(built, folder)
    _edit(folder, how, tmp_path, build_tiny(str(exported))[1])
    result = run_cli("run", str(folder), "--random", "-o", str(tmp_path / "out.npz"))
    _one_error_line(result, message)


def test_a_reference_linked_out_of_the_build_is_refused(built, tmp_path):
    from test_cli_faults import _one_error_line

    folder = tmp_path / "build"
    shutil.copytree(built, folder)
    (folder / "check.npz").rename(tmp_path / "check.npz")
    (folder / "check.npz").symlink_to(tmp_path / "check.npz")
    result = run_cli("run", str(folder), "--check", "-o", str(tmp_path / "out.npz"))
    _one_error_line(result, "which is not a file of the build folder")


# --- run -o never replaces an input or a file of the build -------------------------------


def test_run_refuses_to_overwrite_its_input_or_the_builds_reference(built, tmp_path):
    from test_cli_faults import _one_error_line

    folder = tmp_path / "build"
    shutil.copytree(built, folder)
    reference = (folder / "check.npz").read_bytes()
    result = run_cli("run", str(folder), "--random", "-o", str(folder / "check.npz"))
    _one_error_line(result, "is a file of the build")
    assert (folder / "check.npz").read_bytes() == reference
    with np.load(folder / "check.npz") as saved:
        inputs = {k.removeprefix("input:"): saved[k] for k in saved.files if "input:" in k}
    np.savez(tmp_path / "x.npz", **inputs)
    before = (tmp_path / "x.npz").read_bytes()
    result = run_cli("run", str(folder), "--input", str(tmp_path / "x.npz"), "-o",
                     str(tmp_path / "x.npz"))
    _one_error_line(result, "is the input file")
    assert (tmp_path / "x.npz").read_bytes() == before


# --- leftovers and odd destinations --------------------------------------------------------


def test_a_build_removes_the_staging_folder_a_killed_build_left(exported, tmp_path):
    dead = tmp_path / ".out.99999999.k1ll3d"  # above Linux's largest PID: never running
    dead.mkdir()
    (dead / "model.so").write_bytes(b"half")
    alive = tmp_path / f".out.{os.getpid()}.running"
    alive.mkdir()
    compiled = api.compile_model(api.import_model(str(exported)), api.get_target(HOST),
                                 api.BuildOptions())
    api.build(compiled, tmp_path / "out")
    assert not dead.exists() and alive.exists()
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_build_to_a_linked_destination_is_refused_and_leaves_no_link(tmp_path):
    from test_cli_faults import _one_error_line

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    result = run_cli("build", "tiny-resnet", "-o", str(tmp_path / "link"))
    _one_error_line(result, "is a symbolic link")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


def test_a_file_as_the_tuning_logs_root_is_an_error_for_build(tmp_path, monkeypatch):
    from test_cli_faults import _one_error_line

    (tmp_path / "logs").write_text("not a folder")
    monkeypatch.setenv("TVMFUSE_TUNING_LOGS", str(tmp_path / "logs"))
    result = run_cli("build", "tiny-resnet", "-o", str(tmp_path / "out"))
    _one_error_line(result, "is a file, not a folder")


# --- a record on another kernel's workload -------------------------------------------------


@pytest.fixture(scope="module")
def swapped(tmp_path_factory) -> Path:
    """Two workloads of a committed database with their records, the workload lines swapped:
    each record now names the other kernel."""
    from tvmfuse import env

    source = sorted(env.SHIPPED_TUNING_LOGS.glob("avx512-*"))[0]
    with open(source / database.WORKLOADS) as f:
        workloads = f.readlines()
    with open(source / database.RECORDS) as f:
        records = f.readlines()
    for other in range(1, len(workloads)):  # the first kernel whose trace differs from k0's
        folder = tmp_path_factory.mktemp("swapped")
        (folder / database.WORKLOADS).write_text(workloads[other] + workloads[0])
        (folder / database.RECORDS).write_text("".join(
            line.replace(f"[{other},", "[1,", 1) if line.startswith(f"[{other},") else line
            for line in records if json.loads(line)[0] in (0, other)))
        if database.replay(database.read(folder)):
            return folder
    raise AssertionError("every pair of kernels replays the other's trace")


def test_a_record_of_another_kernel_is_skipped_by_a_build(swapped, tmp_path, caplog):
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tvmfuse.passes import ApplyScheduleRules
    from tvmfuse.passes.apply_database import ApplyDatabase

    folder = tmp_path / "db"
    shutil.copytree(swapped, folder)
    assert database.replay(database.read(folder))  # the case is real: they do not replay
    kernels = [ms.database.Workload.from_json(w).mod["main"]
               for w in database.read(folder).workloads]
    mod = tvm.IRModule({f"k{i}": f.with_attr("global_symbol", f"k{i}")
                        for i, f in enumerate(kernels)})
    with api.get_target(HOST).tvm_target():
        ApplyDatabase(folder, ApplyScheduleRules([]))(mod)
    assert "do not replay on their kernel and are skipped" in caplog.text
    assert (folder / database.RECORDS).read_text() == (swapped / database.RECORDS).read_text()


def test_purge_sets_aside_a_record_of_another_kernel(swapped, tmp_path):
    folder = tmp_path / "db"
    shutil.copytree(swapped, folder)
    purge = run_cli("db", "purge", str(folder), "--json")
    assert purge.returncode == 0, purge.stderr
    assert json.loads(purge.stdout)["dropped"]["not replaying"] > 0
    assert database.quarantined(folder) > 0
    assert not database.replay(database.read(folder))
