"""Fault injection on tuning databases (SQLite's crash and I/O-error tests are the model): a real
database damaged at every line in turn, truncated, emptied and garbled; a rewrite stopped between
its two renames; tuning jobs killed with SIGKILL and SIGTERM. Every case checks the same
invariants: no good record lost, none attached to another workload, nothing the user sees is a
traceback."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tvmfuse import env
from tvmfuse.tuning import database

from conftest import REPO, run_cli

#: How many workloads of the committed database the damaged copies hold (each ~100 KB).
WORKLOADS = 5
DAMAGES = ("garbage", "truncated", "blank")


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """The first workloads of a committed database and all their records: real workloads, real
    traces, small enough to damage line by line."""
    source = sorted(env.SHIPPED_TUNING_LOGS.glob("avx512-*"))[0]
    folder = tmp_path_factory.mktemp("small")
    with open(source / database.WORKLOADS) as f:
        workloads = [next(f) for _ in range(WORKLOADS)]
    with open(source / database.RECORDS) as f:
        records = [line for line in f if json.loads(line)[0] < WORKLOADS]
    (folder / database.WORKLOADS).write_text("".join(workloads))
    (folder / database.RECORDS).write_text("".join(records))
    assert len(records) >= WORKLOADS
    return folder


def _pairs(db: database.Database) -> set[str]:
    """Each record with the content of the workload it is attached to."""
    return {json.dumps([db.workloads[i][0], body], sort_keys=True) for i, body in db.records}


def _damage(path: Path, line: int, how: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    text = lines[line].rstrip("\n")
    lines[line] = {"garbage": "garbage\n", "truncated": text[:len(text) // 2] + "\n",
                   "blank": "\n"}[how]
    path.write_text("".join(lines))


def _cases(folder_lines: dict[str, int]):
    return [(name, line, how) for name, count in folder_lines.items() for line in range(count)
            for how in DAMAGES]


def _line_counts(folder: Path) -> dict[str, int]:
    return {name: len((folder / name).read_text().splitlines()) for name in database.FILES}


@pytest.fixture(scope="module")
def cases(small):
    return _cases(_line_counts(small))


def test_every_damaged_line_loses_only_its_own_records_and_misattaches_none(small, cases,
                                                                           tmp_path):
    """Each line of each file damaged in turn (garbage, cut in half, blanked): the records read
    are exactly the good ones, each on its own workload; purge, merge and the build's clean copy
    keep them so; what a rewrite cannot keep is in the quarantine."""
    good = _pairs(database.read(small))
    records = (small / database.RECORDS).read_text().splitlines()
    for name, line, how in cases:
        folder = tmp_path / f"{name}-{line}-{how}"
        shutil.copytree(small, folder)
        _damage(folder / name, line, how)
        if name == database.RECORDS:  # that record is gone; every other one stays
            lost = {json.dumps([database.read(small).workloads[json.loads(records[line])[0]][0],
                                json.loads(records[line])[1]], sort_keys=True)}
        else:  # the records of that workload cannot be attributed (and are quarantined)
            shash = database.read(small).workloads[line][0]
            lost = {p for p in good if json.loads(p)[0] == shash}
        db = database.read(folder)
        case = f"{name} line {line + 1} {how}"
        assert _pairs(db) == good - lost, case
        assert any(p.line == line + 1 and p.file == name for p in db.problems), case
        # purge rewrites the folder: the same records, the damaged lines set aside
        with database.locked(folder):
            database.purge(db)
            database.write(db)
        again = database.read(folder)
        assert _pairs(again) == good - lost and again.sound, case
        assert database.quarantined(folder) == len(db.problems or []) + (
            1 + len(lost) if name == database.WORKLOADS else 1), case
        merged = tmp_path / f"merged-{name}-{line}-{how}"
        database.merge_folders([folder], merged)
        assert _pairs(database.read(merged)) == good - lost, case


def test_the_build_copy_of_a_damaged_database_loads_in_metaschedule_on_the_right_workloads(
        small, cases, tmp_path):
    """What a build hands MetaSchedule: every record on the workload it was measured for, by
    TVM's own structural hash, and every trace replays on it."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    target = database.read(small).records[0][1][2]  # the target the records were tuned for
    for name, line, how in cases:  # each loads TVM's JSON database
        folder = tmp_path / f"{name}-{line}-{how}"
        shutil.copytree(small, folder)
        _damage(folder / name, line, how)
        applied = database.usable(folder, target, tmp_path / f"scratch-{name}-{line}-{how}")
        loaded = ms.database.JSONDatabase(work_dir=str(applied)).get_all_tuning_records()
        db = database.read(applied)
        assert len(loaded) == len(db.records) > 0
        by_hash = {w[0] for w in db.workloads}
        for record in loaded:
            assert str(tvm_ffi.structural_hash(record.workload.mod)) in by_hash
        assert database.replay(db) == []


def test_truncated_and_empty_files_lose_nothing_they_still_hold(small, tmp_path):
    good = _pairs(database.read(small))
    sizes = {name: (small / name).stat().st_size for name in database.FILES}
    for name in database.FILES:
        for fraction in (0.0, 0.3, 0.7, 0.99):
            folder = tmp_path / f"{name}-{fraction}"
            shutil.copytree(small, folder)
            with open(folder / name, "r+b") as f:
                f.truncate(int(sizes[name] * fraction))
            db = database.read(folder)
            assert _pairs(db) <= good  # nothing misattached
            if name == database.RECORDS:  # the records before the cut are all there
                kept = (folder / name).read_text().count("\n")
                assert len(db.records) == kept
    # an empty workload file: every record is unattributable, none is silently dropped
    folder = tmp_path / "no-workloads"
    shutil.copytree(small, folder)
    (folder / database.WORKLOADS).write_text("")
    purge = run_cli("db", "purge", str(folder))
    assert purge.returncode == 0 and "Traceback" not in purge.stderr
    assert database.quarantined(folder) == len(good)


def test_a_rewrite_stopped_between_its_renames_is_finished_and_read_whole(small, tmp_path):
    """Crash states of the two-file commit, made by hand: before the first rename (the old
    files are whole) and between the two (the new workload file is in place)."""
    good = _pairs(database.read(small))
    db = database.read(small)
    extra = [db.records[0][0], [db.records[0][1][0], [0.5], db.records[0][1][2], []]]
    for stop in ("before", "between"):
        folder = tmp_path / stop
        shutil.copytree(small, folder)
        new = database.Database(folder, list(db.workloads), [*db.records, extra])
        new.workloads.append(["hX", "workload-X"])  # a workload without records, dropped
        rows = {database.WORKLOADS: new.workloads[:-1],
                database.RECORDS: [[i, b] for i, b in new.records]}
        for name, row in rows.items():
            (folder / f".{name}.new").write_text("".join(json.dumps(r) + "\n" for r in row))
        if stop == "between":
            os.replace(folder / f".{database.WORKLOADS}.new", folder / database.WORKLOADS)
        expected = good | _pairs(new) if stop == "between" else good
        assert _pairs(database.read(folder)) == expected  # a reader sees one whole state
        with database.locked(folder):  # the next writer finishes (or undoes) the rewrite
            pass
        assert not list(folder.glob(".*.new"))
        assert _pairs(database.read(folder)) == expected


def _records_in(folders: list[Path]) -> set[str]:
    found = set()
    for folder in folders:
        found |= _pairs(database.read(folder))
    return found


def _tune(db: Path, trials: int = 4) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tvmfuse", "tune", "tiny-resnet", "--trials",
                             str(trials), "--trials-per-iter", "2", "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})


@pytest.mark.slow  # twelve tuning jobs killed: 6 minutes on 2 cores
@pytest.mark.parametrize("runs", [12])
def test_tune_killed_with_sigkill_at_random_points_loses_no_measured_record(tmp_path, runs):
    """SIGKILL at seeded random points of tuning jobs (importing, seeding, searching): every
    record a job had measured is in the database after recovery, and the next job resumes."""
    db = tmp_path / "db"
    rng = random.Random(runs)
    for run in range(runs):
        job = _tune(db)
        time.sleep(rng.uniform(6.0, 30.0))
        job.send_signal(signal.SIGKILL)
        job.wait()
        leftovers = database.leftover_jobs(db) if db.exists() else []
        measured = _records_in([d for j in leftovers for d in database.job_databases(j)])
        before = _records_in([db]) if database.has_database(db) else set()
        check = run_cli("db", "check", str(db)) if db.exists() else None
        if leftovers:
            assert check.returncode == 1 and "was killed" in check.stdout, check.stdout
        recover = run_cli("db", "recover", str(db)) if db.exists() else None
        if recover is not None:
            assert recover.returncode == 0, recover.stderr
            after = _records_in([db]) if database.has_database(db) else set()
            assert measured | before <= after, f"run {run}: records lost"
            assert not database.leftover_jobs(db)
    finished = _tune(db, trials=0)  # resumes: every kernel has its seed
    _, stderr = finished.communicate(timeout=600)
    assert finished.returncode == 0, stderr
    check = run_cli("db", "check", str(db))
    assert check.returncode == 0, check.stdout + check.stderr


def _read_stderr(job: subprocess.Popen) -> tuple[list[str], threading.Thread]:
    """``job``'s stderr as it comes, read on the returned thread into the returned list."""
    chunks: list[str] = []
    reader = threading.Thread(
        target=lambda: chunks.extend(iter(lambda: job.stderr.read(64), "")), daemon=True)
    reader.start()
    return chunks, reader


def _wait_until(job: subprocess.Popen, done, timeout: float) -> bool:
    """Wait until ``done()`` (True), or the job ended or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    while not done():
        if job.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _wait_for(job: subprocess.Popen, chunks: list[str], marker: str, timeout: float) -> bool:
    """Wait until ``marker`` is in ``chunks`` (True), or the job ended or ``timeout`` passed."""
    return _wait_until(job, lambda: marker in "".join(chunks), timeout)


def _wait_for_a_seed(job: subprocess.Popen, db: Path, timeout: float) -> bool:
    """Wait until the running job's folder in ``db`` holds a measured record (True), or the job
    ended or ``timeout`` passed."""
    return _wait_until(job, lambda: any(
        database.read(f).records for j in db.glob(f"{database.JOB_PREFIX}*")
        for f in database.job_databases(j)), timeout)


@pytest.mark.parametrize("phase", ["early", pytest.param("searching", marks=pytest.mark.slow)])
def test_tune_stopped_with_sigterm_merges_what_it_measured(tmp_path, phase):
    """SIGTERM while the job measures its seeds (as soon as its folder holds the first) and
    while MetaSchedule searches: 3 s after its progress bar appeared, inside its first batch of
    candidates, where the signal lands inside a TVM call, which hands the exception back as its
    own. Both moments are found by what the job wrote, not by a time: the seeds took 150 s on
    one machine and 25 s on another, and a fixed 15 s could land before the first seed where
    tests run side by side."""
    db = tmp_path / "db"
    job = _tune(db, trials=8)
    chunks, reader = _read_stderr(job)
    if phase == "early":
        assert _wait_for_a_seed(job, db, timeout=600), "".join(chunks)
    else:
        assert _wait_for(job, chunks, "search:", timeout=600), "".join(chunks)
        time.sleep(3)
    job.send_signal(signal.SIGTERM)
    job.wait(timeout=120)
    reader.join(timeout=30)  # the pipe drained to its end
    stderr = "".join(chunks)
    assert job.returncode == 130 and "Traceback" not in stderr, stderr
    if phase == "searching":
        assert "tuned for" not in stderr, stderr  # stopped before the search ended
    assert not database.leftover_jobs(db)
    assert database.read(db).records  # the seeds it had measured


@pytest.mark.slow  # five CLI processes, a tuning among them: 60 s
@pytest.mark.parametrize("damage", ["workload line", "empty workload file"])
def test_every_command_tolerates_a_damaged_database(small, tmp_path, damage):
    """build, tune, check, purge and merge on one damaged database: no traceback, the good
    records kept on their workloads, tune's new records added beside them."""
    folder = tmp_path / "db"
    shutil.copytree(small, folder)
    if damage == "empty workload file":
        (folder / database.WORKLOADS).write_text("")
    else:
        name = database.WORKLOADS if damage == "workload line" else database.RECORDS
        _damage(folder / name, 1, "garbage")
    good = _pairs(database.read(folder))
    build = run_cli("build", "tiny-resnet", "--db", str(folder), "-o", str(tmp_path / "out"))
    assert build.returncode == 0 and "Traceback" not in build.stderr, build.stderr
    assert build.stderr.count("unusable and skipped") == 1  # one warning, not one per line
    tune = run_cli("tune", "tiny-resnet", "--trials", "0", "--db", str(folder))
    assert tune.returncode == 0 and "Traceback" not in tune.stderr, tune.stderr
    after = _pairs(database.read(folder))
    assert good < after  # tiny-resnet's seeds added, nothing of the rest lost or moved
    check = run_cli("db", "check", str(folder))
    assert check.returncode in (0, 1) and "Traceback" not in check.stderr
    merged = run_cli("db", "merge", str(folder), "--into", str(tmp_path / "merged"))
    assert merged.returncode == 0 and "Traceback" not in merged.stderr, merged.stderr
    assert _pairs(database.read(tmp_path / "merged")) == after
    purge = run_cli("db", "purge", str(folder))
    assert purge.returncode == 0 and "Traceback" not in purge.stderr, purge.stderr
    assert _pairs(database.read(folder)) == after
    assert run_cli("db", "check", str(folder)).returncode == 0
