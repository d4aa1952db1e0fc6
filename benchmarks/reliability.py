"""The numbers of RELIABILITY.md: the fault-injection suite at full size, counted.

1. **Database damage**: a committed database damaged at every line of both files in turn
   (garbage, the line cut in half, blanked) and truncated at every tenth of each file; each
   copy read, purged and merged, and the build's clean copy loaded by MetaSchedule. Counted:
   good records lost (records whose own line and workload line are intact, missing after the
   operation) and records attached to another workload (by TVM's structural hash).
2. **Killed tuning jobs**: ``tvmfuse tune`` killed with SIGKILL at seeded random points, N
   times over one database; after each kill the records the job had written are compared with
   the database after ``tvmfuse db recover``.
3. **CLI**: every argument error of ``ARGUMENT_ERRORS`` timed (median of 3 runs), an
   unreachable tracker timed, and every bad-input run scanned for a traceback.

    python benchmarks/reliability.py --json benchmarks/reliability.json [--kills 12]
        [--kill-window 8,120] [--only cli|damage|kills]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tvmfuse import env
from tvmfuse.tuning import database

DAMAGES = ("garbage", "truncated", "blank")

#: Invocations wrong in their arguments alone, each answered with one error line before torch
#: and TVM are imported (tests/test_cli_faults.py checks the messages); run in a folder holding
#: the file ``a-file``.
ARGUMENT_ERRORS = [
    "build tiny-resnet -o a-file", "build tiny-resnet -o o --dump-ir a-file",
    "build nothing.py:f -o o", "build tiny-transformer --dynamic seq -o o",
    "build tiny-transformer --max-seq 64 -o o", "build tiny-resnet --target sparc -o o",
    "build tiny-resnet --input-shape 1,a -o o", "build tiny-resnet --db no-such-db -o o",
    "build tiny-resnet --verify --rpc 127.0.0.1:1:k -o o", "tune tiny-resnet --budget nan",
    "tune tiny-resnet --budget=-5m", "tune tiny-resnet --rpc 127.0.0.1:1:k",
    "run o --random --repeat -5", "run o --random -o out.txt", "bench tiny-resnet --threads 0",
    "bench tiny-resnet --max-seconds -1", "bench tiny-resnet --engines tvmfuse,tensorrt",
    "db purge no-such-db", "db check no-such-db",
]


def _pairs(db) -> set[str]:
    return {json.dumps([db.workloads[i][0], body], sort_keys=True) for i, body in db.records}


def _damage(path: Path, line: int, how: str) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    text = lines[line].rstrip(b"\n")
    lines[line] = {"garbage": b"garbage\n", "truncated": text[:len(text) // 2] + b"\n",
                   "blank": b"\n"}[how]
    path.write_bytes(b"".join(lines))


def database_damage(source: Path, work: Path) -> dict:
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    original = database.read(source)
    good = _pairs(original)
    records = (source / database.RECORDS).read_text().splitlines()
    target = original.records[0][1][2]
    counts = {"cases": 0, "good_records_lost": 0, "misattached": 0, "quarantined": 0,
              "metaschedule_loads": 0, "metaschedule_misattached": 0}
    lines = {name: len((source / name).read_bytes().splitlines()) for name in database.FILES}
    cases = [(n, i, h) for n, c in lines.items() for i in range(c) for h in DAMAGES]
    cases += [(n, f, "cut") for n in database.FILES for f in (0.1, 0.3, 0.5, 0.7, 0.9)]
    for number, (name, where, how) in enumerate(cases):
        folder = work / f"case{number}"
        shutil.copytree(source, folder)
        if how == "cut":
            with open(folder / name, "r+b") as f:
                f.truncate(int((folder / name).stat().st_size * where))
            kept_lines = (folder / name).read_bytes().count(b"\n")
            if name == database.RECORDS:
                lost = {json.dumps([original.workloads[json.loads(r)[0]][0], json.loads(r)[1]],
                                   sort_keys=True) for r in records[kept_lines:]}
            else:
                alive = {w[0] for w in original.workloads[:kept_lines]}
                lost = {p for p in good if json.loads(p)[0] not in alive}
        else:
            _damage(folder / name, where, how)
            if name == database.RECORDS:
                r = json.loads(records[where])
                lost = {json.dumps([original.workloads[r[0]][0], r[1]], sort_keys=True)}
            else:
                shash = original.workloads[where][0]
                lost = {p for p in good if json.loads(p)[0] == shash}
        expected = good - lost
        db = database.read(folder)
        seen = _pairs(db)
        counts["good_records_lost"] += len(expected - seen)
        counts["misattached"] += len(seen - good)
        with database.locked(folder):
            database.purge(db)
            database.write(db)
        after = _pairs(database.read(folder))
        counts["good_records_lost"] += len(expected - after)
        counts["misattached"] += len(after - good)
        counts["quarantined"] += database.quarantined(folder)
        merged = work / f"merged{number}"
        database.merge_folders([folder], merged)
        counts["good_records_lost"] += len(expected - _pairs(database.read(merged)))
        if number % 10 == 0:  # MetaSchedule reads the build's copy (7.5 MB each: a sample)
            shutil.rmtree(folder)
            shutil.copytree(source, folder)
            if how == "cut":
                with open(folder / name, "r+b") as f:
                    f.truncate(int((folder / name).stat().st_size * where))
            else:
                _damage(folder / name, where, how)
            applied = database.usable(folder, target, work / f"scratch{number}")
            hashes = {w[0] for w in database.read(applied).workloads}
            loaded = ms.database.JSONDatabase(work_dir=str(applied)).get_all_tuning_records()
            counts["metaschedule_loads"] += 1
            counts["metaschedule_misattached"] += sum(
                str(tvm_ffi.structural_hash(r.workload.mod)) not in hashes for r in loaded)
        counts["cases"] += 1
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(merged, ignore_errors=True)
    return counts


def killed_jobs(work: Path, kills: int, window: tuple[float, float]) -> dict:
    db = work / "killed"
    rng = random.Random(kills)
    result = {"kills": kills, "kill_window_s": list(window), "records_written_before_kill": 0,
              "records_lost": 0, "kills_with_records_to_recover": 0,
              "database_check_failures": 0, "kill_times_s": []}
    for _ in range(kills):
        job = subprocess.Popen([sys.executable, "-m", "tvmfuse", "tune", "tiny-resnet", "--trials",
                                "4", "--trials-per-iter", "2", "--db", str(db)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        delay = rng.uniform(*window)
        result["kill_times_s"].append(round(delay, 1))
        time.sleep(delay)
        job.send_signal(signal.SIGKILL)
        job.wait()
        if not db.exists():
            continue
        jobs = database.leftover_jobs(db)
        written = set()
        for j in jobs:
            for d in database.job_databases(j):
                written |= _pairs(database.read(d))
        result["records_written_before_kill"] += len(written)
        recover = subprocess.run([sys.executable, "-m", "tvmfuse", "db", "recover", str(db)],
                                 capture_output=True, text=True)
        after = _pairs(database.read(db)) if database.has_database(db) else set()
        result["records_lost"] += len(written - after)
        result["kills_with_records_to_recover"] += bool(written)
        assert recover.returncode == 0, recover.stderr
        check = subprocess.run([sys.executable, "-m", "tvmfuse", "db", "check", str(db)],
                               capture_output=True, text=True)
        result["database_check_failures"] += check.returncode != 0
    return result


def killed_in_search(work: Path, kills: int) -> dict:
    """Kill -9 a tuning job the moment its search has written its first candidate's record (on
    2 cores that is minutes in; random points rarely land after it), then recover."""
    result = {"kills": kills, "search_records_on_disk_at_kill": 0, "records_lost": 0,
              "seconds_to_first_search_record": []}
    for run in range(kills):
        db = work / f"search-kill-{run}"
        start = time.perf_counter()
        job = subprocess.Popen([sys.executable, "-m", "tvmfuse", "tune", "tiny-resnet", "--trials",
                                "8", "--trials-per-iter", "2", "--db", str(db)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while job.poll() is None and time.perf_counter() - start < 900:
            searched = [d for d in db.glob(f"{database.JOB_PREFIX}*/search-*")
                        if database.has_database(d)]
            if sum(len((d / database.RECORDS).read_text().splitlines()) for d in searched):
                break
            time.sleep(0.5)
        job.send_signal(signal.SIGKILL)
        job.wait()
        result["seconds_to_first_search_record"].append(round(time.perf_counter() - start))
        written = set()
        for j in database.leftover_jobs(db):
            for d in database.job_databases(j):
                if d.name.startswith("search-"):
                    result["search_records_on_disk_at_kill"] += len(database.read(d).records)
                written |= _pairs(database.read(d))
        subprocess.run([sys.executable, "-m", "tvmfuse", "db", "recover", str(db)], check=True,
                       capture_output=True)
        result["records_lost"] += len(written - _pairs(database.read(db)))
    return result


def cli_times(work: Path) -> dict:
    (work / "a-file").write_text("")
    times = {}
    tracebacks = 0
    for command in ARGUMENT_ERRORS:
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "tvmfuse", *command.split()],
                                  capture_output=True, text=True, cwd=work)
            runs.append(time.perf_counter() - start)
            tracebacks += "Traceback" in done.stderr
        times[command] = round(statistics.median(runs), 3)
    trackers = {}
    for address in ("127.0.0.1:1:k", "192.0.2.1:9190:k"):  # refused; TEST-NET, no answer
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "tvmfuse", "run", str(work), "--random",
                               "--rpc", address], capture_output=True, text=True, cwd=work)
        trackers[address] = round(time.perf_counter() - start, 2)
        tracebacks += "Traceback" in done.stderr
    return {"argument_error_seconds": times, "max_argument_error_seconds": max(times.values()),
            "unreachable_tracker_seconds": trackers, "tracebacks": tracebacks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--kill-window", default="8,120", metavar="MIN,MAX",
                        help="seconds after the start a job is killed, drawn uniformly")
    parser.add_argument("--search-kills", type=int, default=2,
                        help="jobs killed right after their first searched record")
    parser.add_argument("--only", choices=("cli", "damage", "kills", "search-kills"),
                        action="append",
                        help="run only these parts (default: all)")
    args = parser.parse_args()
    parts = args.only or ["cli", "damage", "kills", "search-kills"]
    window = tuple(float(x) for x in args.kill_window.split(","))
    os.environ.setdefault("TVMFUSE_TUNING_LOGS", tempfile.mkdtemp(prefix="reliability-user-"))
    with tempfile.TemporaryDirectory(prefix="reliability-") as scratch:
        work = Path(scratch)
        source = sorted(env.SHIPPED_TUNING_LOGS.glob("avx512-*"))[0]
        report = json.loads(args.json.read_text()) if args.json.is_file() else {}
        report["database"] = str(source.relative_to(env.SHIPPED_TUNING_LOGS))
        if "cli" in parts:
            report["cli"] = cli_times(work)
            print(json.dumps(report["cli"], indent=1), flush=True)
        if "damage" in parts:
            report["database_damage"] = database_damage(source, work)
            print(json.dumps(report["database_damage"], indent=1), flush=True)
        if "kills" in parts:
            report["killed_jobs"] = killed_jobs(work, args.kills, window)
            print(json.dumps(report["killed_jobs"], indent=1), flush=True)
        if "search-kills" in parts:
            report["killed_in_search"] = killed_in_search(work, args.search_kills)
            print(json.dumps(report["killed_in_search"], indent=1), flush=True)
    report["cpu"] = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo"],
                                   capture_output=True, text=True).stdout.strip()
    args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
