"""Tuning database hygiene: round trip, merge, purge, corrupt lines, foreign targets, concurrent
writers, an interrupted tuning job, and the `tvmfuse db` command."""

import json
import logging
import multiprocessing

import pytest

from tests.conftest import run_cli
from tvmfuse import api
from tvmfuse.tuning import database

from conftest import HOST
from conftest import database_record as _record
from conftest import write_database as _write

HOST_CONFIG = api.get_target(HOST).config
ARM = api.get_target("arm64").config


def test_round_trip_keeps_every_record(tmp_path):
    records = [_record(0, 0.002), _record(1, 0.001), _record(1, 0.003, trace="u")]
    db = database.read(_write(tmp_path / "a", [0, 1], records))
    database.write(db, tmp_path / "b")
    again = database.read(tmp_path / "b")
    assert again.workloads == db.workloads and again.records == records
    assert again.best_seconds() == pytest.approx({0: 0.002, 1: 0.001})


def test_a_corrupt_line_is_named_and_the_rest_loads(tmp_path):
    folder = _write(tmp_path, [0], [_record(0, 0.002)], ['[0, {"trace": ', "[7, 8]"])
    db = database.read(folder)
    assert [str(p) for p in db.problems] == [
        "database_tuning_record.json line 2: not valid JSON (Expecting value)",
        "database_tuning_record.json line 3: not a [workload, [trace, run seconds, target, "
        "args]] record",
    ]
    assert len(db.records) == 1


def test_purge_drops_failed_foreign_and_orphaned(tmp_path):
    records = [_record(0, 1e10), _record(1, 0.001), _record(2, 0.002, ARM)]
    folder = _write(tmp_path, [0, 1, 2], records, ["not json"])
    db = database.read(folder)
    dropped = database.purge(db, HOST_CONFIG)
    assert dropped == {"failed": 1, "other target": 1, "corrupt lines": 1,
                       "workloads without records": 2}
    assert db.workloads == [["h1", "workload-1"]]
    assert db.records == [[0, _record(1, 0.001)[1]]]  # renumbered


def test_merge_deduplicates_workloads_and_records(tmp_path):
    a = database.read(_write(tmp_path / "a", [0, 1], [_record(0, 0.002), _record(1, 0.001)]))
    b = database.read(_write(tmp_path / "b", [1, 2], [_record(0, 0.003), _record(1, 0.005),
                                                      _record(0, 0.001)]))
    # workload-1 at 3 ms is new, workload-2 is new, workload-1 at 1 ms is a's own record
    assert database.merge_into(a, b) == 2
    assert [w[1] for w in a.workloads] == ["workload-0", "workload-1", "workload-2"]
    assert a.records[-1][0] == 2
    assert database.merge_into(a, b) == 0  # merging again adds nothing


def _merge_one(args):
    into, source = args
    from pathlib import Path

    with database.locked(Path(into)):
        dest = database.read(Path(into))
        database.merge_into(dest, database.read(Path(source)))
        database.write(dest)


def test_concurrent_merges_lose_nothing(tmp_path):
    into = _write(tmp_path / "into", [], [])
    sources = [_write(tmp_path / f"s{i}", [i], [_record(0, 0.001 * (i + 1))]) for i in range(8)]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_merge_one, [(str(into), str(s)) for s in sources])
    db = database.read(into)
    assert len(db.workloads) == 8 and len(db.records) == 8 and not db.problems


def test_a_build_skips_other_targets_records(tmp_path, caplog):
    folder = _write(tmp_path / "db", [0, 1], [_record(0, 0.001, ARM), _record(1, 0.001)])
    with caplog.at_level(logging.WARNING):
        usable = database.usable(folder, HOST_CONFIG, tmp_path / "scratch")
    assert usable == tmp_path / "scratch"
    assert "1 record(s) for another target" in caplog.text and '"mtriple"' in caplog.text
    assert len(database.read(usable).records) == 1
    only_arm = _write(tmp_path / "arm", [0], [_record(0, 0.001, ARM)])
    assert database.usable(only_arm, HOST_CONFIG, tmp_path / "scratch2") is None
    clean = _write(tmp_path / "clean", [0], [_record(0, 0.001)])
    assert database.usable(clean, HOST_CONFIG, tmp_path / "scratch3") == clean


def test_an_interrupted_tuning_job_keeps_its_records(monkeypatch, tmp_path):
    """Ctrl-C during a search: every kernel's seed goes into the database (the searched one's
    as first timed: its verification never ran), what the search timed is kept in the
    database's ``logs/`` folder, and the job's private folder is gone."""
    import importlib

    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    from tvmfuse import strategy

    tune_module = importlib.import_module("tvmfuse.tuning.tune")  # the package exports tune()
    target = api.get_target(HOST).tvm_target()

    def interrupted(task, _target, _scheduler, _timer, work_dir, *_, **__):
        work_dir.mkdir(parents=True)
        db = ms.database.JSONDatabase(work_dir=str(work_dir))  # one candidate timed, then ^C
        workload = task.dispatched[0]
        db.commit_tuning_record(ms.database.TuningRecord(
            s_tir.Schedule(workload).trace, db.commit_workload(workload), [0.004], target,
            ms.arg_info.ArgInfo.from_prim_func(workload["main"])))
        raise KeyboardInterrupt

    monkeypatch.setattr(tune_module, "search_task", interrupted)
    db_dir = tmp_path / "db"
    host = api.get_target(HOST)
    model = api.import_model("tiny-resnet")
    mod, _ = api.analyze(model, host, api.BuildOptions(use_database=False))
    with target, pytest.raises(KeyboardInterrupt):
        tune_module.tune(mod, target, db_dir, trials=1, scheduler=strategy.scheduler(host),
                         tir_pipeline=strategy.for_target(host).tir_pipeline(), progress=False)
    records = database.read(db_dir).records
    assert len(records) == 6 and all(r[1][1] != [0.004] for r in records)  # the seeds
    (kept,) = (db_dir / tune_module.CANDIDATES).glob("*/database_tuning_record.json")
    assert database.read(kept.parent).records[0][1][1] == [0.004]
    assert not list(db_dir.glob(".tune-*"))  # the job's private folder is gone


def test_db_cli_check_stats_purge_merge(tmp_path):
    folder = _write(tmp_path / "db", [0, 1], [_record(0, 1e10), _record(1, 0.001, ARM)],
                    ["{broken"])
    check = run_cli("db", "check", str(folder), "--target", HOST)
    assert check.returncode == 1
    assert "database_tuning_record.json line 3: not valid JSON" in check.stdout
    assert "1 record(s) for another target" in check.stdout
    stats = json.loads(run_cli("db", "stats", str(folder), "--json").stdout)
    assert (stats["workloads"], stats["records"], stats["failed_records"]) == (2, 2, 1)
    purge = run_cli("db", "purge", str(folder), "--target", HOST)
    assert purge.returncode == 0, purge.stderr
    assert run_cli("db", "check", str(folder)).returncode == 0
    other = _write(tmp_path / "other", [5], [_record(0, 0.002)])
    merged = run_cli("db", "merge", str(other), "--into", str(tmp_path / "new"))
    assert merged.returncode == 0, merged.stderr
    assert len(database.read(tmp_path / "new").records) == 1


def test_search_plan_follows_measured_time_within_trials():
    from tvmfuse.tuning.tune import TaskPlan, _plan_search

    plans = [TaskPlan("a", 1, 1e9, False, seconds=0.001), TaskPlan("b", 4, 1e6, False,
                                                                    seconds=0.002),
             TaskPlan("c", 1, 1e9, True, seconds=0.010), TaskPlan("d", 1, 1e3, False,
                                                                   seconds=1e-6)]
    _plan_search(plans, trials=12, top_k=2, retune=False, only=None, trials_per_iter=4)
    # b takes 8 ms a run, a 1 ms; c is in the database already; top 2 of what is left
    assert {p.name: p.trials for p in plans} == {"a": 4, "b": 8, "c": 0, "d": 0}


def test_tune_cli_reads_budgets():
    from tvmfuse.cli.tune import _duration

    assert (_duration("45m"), _duration("2h"), _duration("90s"), _duration("30")) == (
        2700, 7200, 90, 30)
    bad = run_cli("tune", "tiny-resnet", "--budget", "soon")
    assert bad.returncode == 2 and "not a duration like 45m" in bad.stderr
