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
4. **Trust boundaries** (issue #46), each case a crafted file or link handed to the CLI as a
   user would: code run by loading a ``.pt2``, ``.npy``/``.npz`` inputs or ``check.npz``
   (``code``); files changed outside the folder a command names, or a library loaded from
   outside its build (``writes``); builds failed by one record with an unmeasured run time
   (``records``); NaN/Inf that ``tvmfuse run`` places elsewhere than PyTorch (``nan``); every
   command of these groups and the one-line cases (edited manifests, a full disk, late argument
   errors) scanned for a traceback (``one-line``).

    python benchmarks/reliability.py --json benchmarks/reliability.json [--kills 12]
        [--kill-window 8,120] [--only cli|damage|kills|search-kills|trust]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

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


class _Cli:
    """``tvmfuse`` run as a user runs it, counting the commands and the tracebacks they print."""

    def __init__(self):
        self.commands = 0
        self.tracebacks = 0
        self.with_traceback: list[str] = []

    def __call__(self, *args: str, cwd: Path | None = None,
                 env: dict | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "tvmfuse", *map(str, args)],
                              capture_output=True, text=True, cwd=cwd,
                              env=None if env is None else {**os.environ, **env})
        self.commands += 1
        if "Traceback" in done.stderr + done.stdout:
            self.tracebacks += 1
            self.with_traceback.append(" ".join(map(str, args)))
        return done


class _WritesMarker:
    """A pickle that writes ``marker`` when pickle itself loads it."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def _with_member(source: Path, dest: Path, suffix: str, data: bytes) -> Path:
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(dest, "w") as out:
        for info in src.infolist():
            out.writestr(info, data if info.filename.endswith(suffix) else src.read(info))
    return dest


def _snapshot(*roots: Path) -> dict:
    """Every path under ``roots`` (links not followed) with its bytes or link target."""
    seen = {}
    for root in roots:
        for path in [root, *root.rglob("*")] if root.exists() or root.is_symlink() else []:
            seen[str(path)] = (os.readlink(path) if path.is_symlink() else
                               path.read_bytes() if path.is_file() else "folder")
    return seen


def _database(folder: Path, records: list[str]) -> Path:
    """A database of one made-up workload holding ``records`` (raw record lines)."""
    folder.mkdir(parents=True)
    (folder / database.WORKLOADS).write_text(json.dumps(["h0", "workload-0"]) + "\n")
    (folder / database.RECORDS).write_text("".join(line + "\n" for line in records))
    return folder


def code_executed(work: Path, cli: _Cli, built: Path) -> dict:
    """Pickles that write a marker file when loaded, in each file a user hands tvmfuse."""
    import torch

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 4)

        def forward(self, x):
            return torch.relu(self.linear(x))

    folder = work / "code"
    folder.mkdir()
    pt2 = folder / "small.pt2"
    torch.export.save(torch.export.export(Small(), (torch.randn(2, 8),)), str(pt2))
    marker = folder / "marker"
    payload = pickle.dumps(_WritesMarker(marker))
    evil_inputs = _with_member(pt2, folder / "inputs.pt2", "data/sample_inputs/model.pt", payload)
    evil_weight = _with_member(pt2, folder / "w.pt2", "data/weights/weight_0", payload)
    config = "data/weights/model_weights_config.json"
    with zipfile.ZipFile(evil_weight) as archive:
        text = json.loads(archive.read(f"small/{config}"))
    for entry in text["config"].values():
        entry["use_pickle"] = True  # torch.save's pickled-weight path
    evil_weight = _with_member(evil_weight, folder / "weight.pt2", config,
                               json.dumps(text).encode())
    np.save(folder / "x.npy", np.array([_WritesMarker(marker)], dtype=object), allow_pickle=True)
    np.savez(folder / "x.npz", x=np.array([_WritesMarker(marker)], dtype=object))
    checked = folder / "build"
    shutil.copytree(built, checked)
    np.savez(checked / "check.npz", **{"input:x": np.array([_WritesMarker(marker)], dtype=object)})
    cases = [("build", evil_inputs, "-o", folder / "o1"),
             ("build", evil_weight, "-o", folder / "o2"),
             ("run", built, "--input", folder / "x.npy", "-o", folder / "o.npz"),
             ("run", built, "--input", folder / "x.npz", "-o", folder / "o.npz"),
             ("run", checked, "--check")]
    executed = refused_badly = 0
    for case in cases:
        done = cli(*case, cwd=folder)
        executed += marker.exists()
        refused_badly += done.returncode != 2
        marker.unlink(missing_ok=True)
    return {"cases": len(cases), "executed": executed, "not_refused": refused_badly}


def writes_outside(work: Path, cli: _Cli, built: Path) -> dict:
    """Links and names that point a command out of the folder it is given; after each, every
    file outside that folder is compared with before (and a run of an edited build must be
    refused: it would load a library from outside)."""
    record = json.dumps([0, [[["t"]], [0.001], dict(_host_config()), []]])
    harmed, cases = [], 0

    def case(name: str, args: tuple, outside: list[Path], refused: bool = True) -> None:
        nonlocal cases
        before = _snapshot(*outside)
        done = cli(*args, cwd=work)
        cases += 1
        if _snapshot(*outside) != before or (refused and done.returncode == 0):
            harmed.append(name)

    root = work / "writes"
    root.mkdir()
    victim = root / "victim.txt"
    victim.write_text("keep\n")
    for link in (database.QUARANTINE, ".lock", f".{database.WORKLOADS}.new"):
        db = _database(root / f"db-{link}", [record, "{broken"])
        (db / link).symlink_to(victim)
        case(f"db purge, {link} a link", ("db", "purge", db), [victim], refused=False)
    other = _database(root / "other", [record])
    db = _database(root / "db-job", [record])
    (db / f"{database.JOB_PREFIX}evil").symlink_to(other, target_is_directory=True)
    case("db recover, a job folder linked elsewhere", ("db", "recover", db), [other],
         refused=False)
    photos = root / "photos"
    photos.mkdir()
    (photos / "a.jpg").write_bytes(b"x")
    case("db purge on a folder that is not a database", ("db", "purge", photos), [photos])
    real = root / "real"
    real.mkdir()
    (root / "link").symlink_to(real, target_is_directory=True)
    case("build -o a link", ("build", "tiny-resnet", "-o", root / "link"), [real, root / "link"])
    folder = root / "build"
    shutil.copytree(built, folder)
    case("run -o the build's check.npz", ("run", folder, "--random", "-o", folder / "check.npz"),
         [folder])
    with np.load(folder / "check.npz") as saved:
        np.savez(root / "x.npz", **{k.removeprefix("input:"): saved[k] for k in saved.files
                                    if k.startswith("input:")})
    case("run -o its input", ("run", folder, "--input", root / "x.npz", "-o", root / "x.npz"),
         [root / "x.npz"])
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(built / "model.so", elsewhere / "model.so")
    for how, library in (("../", "../elsewhere/model.so"),
                         ("an absolute path", str(elsewhere / "model.so")),
                         ("/etc/passwd", "../../../../../../../../etc/passwd"),
                         ("a link out", None)):
        edited = root / f"edited-{len(how)}"
        shutil.copytree(built, edited)
        if library is None:
            (edited / "model.so").unlink()
            (edited / "model.so").symlink_to(elsewhere / "model.so")
        else:
            manifest = json.loads((edited / "manifest.json").read_text())
            manifest["library"] = library
            (edited / "manifest.json").write_text(json.dumps(manifest))
        case(f"a manifest naming {how}", ("run", edited, "--random", "-o", root / "out.npz"),
             [elsewhere])
    return {"cases": cases, "harmed": len(harmed), "which": harmed}


def _host_config() -> dict:
    from tvmfuse import api
    from tvmfuse.targets import host_target_name

    return api.get_target(host_target_name()).config


#: Run times a record may hold that no measurement gives (MetaSchedule cannot read NaN; a
#: negative or zero time would win over every measured one).
BAD_TIMES = ("NaN", "Infinity", "-Infinity", "-0.001", "0", "1e308")


def builds_broken(work: Path, cli: _Cli) -> dict:
    """The user's database for this host (the one a default build applies) with one record's
    run time replaced; a default ``tvmfuse build`` must still succeed."""
    from tvmfuse import api
    from tvmfuse.targets import host_target_name

    key = api.get_target(host_target_name()).key
    source = env.SHIPPED_TUNING_LOGS / key
    broken = []
    for seconds in BAD_TIMES:
        logs = work / f"logs-{seconds}"
        shutil.copytree(source, logs / key)
        lines = (logs / key / database.RECORDS).read_text().splitlines(keepends=True)
        first = json.loads(lines[0])
        lines[0] = json.dumps(first).replace(json.dumps(first[1][1]), f"[{seconds}]", 1) + "\n"
        (logs / key / database.RECORDS).write_text("".join(lines))
        done = cli("build", "tiny-resnet", "-o", work / f"out-{seconds}",
                   env={"TVMFUSE_TUNING_LOGS": str(logs)})
        if done.returncode != 0:
            broken.append(seconds)
    return {"cases": len(BAD_TIMES), "broken": len(broken), "which": broken}


def nonfinite_patterns(work: Path, cli: _Cli) -> dict:
    """NaN, +Inf and -Inf placed in an input of each model; ``tvmfuse run``'s outputs compared
    with PyTorch's element by element: a NaN or infinity anywhere else is a difference."""
    from tvmfuse import api

    result = {"cases": 0, "differing": 0, "which": []}
    for source in ("tiny-resnet", "tiny-mobilenet", "tiny-transformer"):
        folder = work / f"nan-{source}"
        assert cli("build", source, "-o", folder).returncode == 0
        model = api.import_model(source)
        for index, spec in enumerate(model.inputs):
            for value in (np.nan, np.inf, -np.inf):
                arrays = [a.copy() for a in model.example_inputs]
                flat = arrays[index].reshape(-1)
                if not np.issubdtype(flat.dtype, np.floating):
                    continue  # token ids hold no NaN
                flat[5] = flat[flat.size // 2 + 7] = value
                np.savez(work / "in.npz", **{s.name: a for s, a in zip(model.inputs, arrays)})
                (work / "out.npz").unlink(missing_ok=True)
                done = cli("run", folder, "--input", work / "in.npz", "-o", work / "out.npz")
                result["cases"] += 1
                got = []
                if done.returncode == 0:
                    with np.load(work / "out.npz") as outs:
                        got = [outs[s.name] for s in model.outputs]
                refs = model.reference(*arrays)
                if not got or any(
                        not np.array_equal(np.isnan(g), np.isnan(r))
                        or not np.array_equal(np.isposinf(g), np.isposinf(r))
                        or not np.array_equal(np.isneginf(g), np.isneginf(r))
                        for g, r in zip(got, refs)):
                    result["differing"] += 1
                    result["which"].append(f"{source} {spec.name} {value}")
    return result


def one_line_cases(work: Path, cli: _Cli, built: Path) -> dict:
    """The faults the CLI must answer in one line (issue #46's list), each run once."""
    folder = work / "lines"
    folder.mkdir()
    (folder / "factories.py").write_text(
        "import torch\n\ndef kwargs():\n"
        "    return torch.nn.Linear(8, 8), {'input': torch.randn(1, 8)}\n")
    (folder / "bad.toml").write_text("[default\n")
    (folder / "a-file").write_text("")
    not_one_line = []
    cases = 0

    def case(*args, env=None, cwd=folder):
        nonlocal cases
        cases += 1
        done = cli(*args, cwd=cwd, env=env)
        errors = [line for line in done.stderr.splitlines() if " ERROR " in line
                  or line.startswith("ERROR")]
        if done.returncode != 2 or len(errors) != 1:
            not_one_line.append(" ".join(map(str, args)))

    for how in ("shape", "dtype", "extra input", "negative", "huge", "non-TVM library"):
        edited = folder / f"edited-{how.replace(' ', '-')}"
        shutil.copytree(built, edited)
        manifest = json.loads((edited / "manifest.json").read_text())
        spec = manifest["inputs"][0]
        if how == "shape":
            spec["shape"][-1] += 1
        elif how == "dtype":
            spec["dtype"] = "float64"
        elif how == "extra input":
            manifest["inputs"].append(dict(spec, name="extra"))
        elif how == "negative":
            spec["shape"][-1] = -3
        elif how == "huge":
            spec["shape"][-1] = 10**12
        else:
            from tvmfuse.runtime import file_digest

            library = next(Path(np.__file__).parent.glob("**/_multiarray_umath*.so"))
            shutil.copy(library, edited / "model.so")
            manifest["files"]["model.so"] = file_digest(edited / "model.so")
        (edited / "manifest.json").write_text(json.dumps(manifest))
        case("run", edited, "--random", "-o", folder / "out.npz")
    huge = folder / "huge.npy"
    with open(huge, "wb") as f:  # 3.5 TiB claimed, a few bytes held
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (1, 3, 1000000, 322122)})
        f.write(b"\0" * 64)
    case("run", built, "--input", huge, "-o", folder / "out.npz")
    case("build", "tiny-resnet", "--input-shape", "99999999999,8", "-o", "o")
    case("build", "factories.py:kwargs", "-o", "o")
    case("build", "tiny-resnet", "-o", ".", cwd=folder / "edited-shape")
    case("bench", "tiny-resnet", "--json", "/nonexistent/x.json")
    case("tune", "tiny-resnet", "--fusion-rules", "bad.toml")
    case("tune", "tiny-resnet", env={"TVMFUSE_TUNING_LOGS": str(folder / "a-file")})
    disk = folder / "disk"  # a full disk: a 2 MiB tmpfs holding a build, filled but for 16 KiB
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(disk)],
                             capture_output=True).returncode == 0
    if mounted:
        try:
            shutil.copytree(built, disk / "build")
            before = _snapshot(disk / "build")
            free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
            (disk / "filler").write_bytes(bytes(free - 16 * 1024))
            case("build", "tiny-resnet", "-o", disk / "build")
            if _snapshot(disk / "build") != before or len(list(disk.iterdir())) != 2:
                not_one_line.append("build onto a full disk changed the earlier build")
        finally:
            subprocess.run(["umount", str(disk)], check=True)
    return {"cases": cases, "not_one_line": len(not_one_line), "which": not_one_line,
            "full_disk_tested": mounted}


def trust(work: Path) -> dict:
    """The groups of issue #46 over one build of tiny-resnet, and the tracebacks of all."""
    cli = _Cli()
    built = work / "built"
    assert cli("build", "tiny-resnet", "-o", built).returncode == 0
    report = {
        "code_executed_from_user_files": code_executed(work, cli, built),
        "writes_outside_the_named_folder": writes_outside(work, cli, built),
        "builds_broken_by_one_record": builds_broken(work, cli),
        "nonfinite_patterns_differing_from_pytorch": nonfinite_patterns(work, cli),
        "one_line_cases": one_line_cases(work, cli, built),
    }
    report["tracebacks"] = {"commands": cli.commands, "tracebacks": cli.tracebacks,
                            "which": cli.with_traceback}
    return report

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--kill-window", default="8,120", metavar="MIN,MAX",
                        help="seconds after the start a job is killed, drawn uniformly")
    parser.add_argument("--search-kills", type=int, default=2,
                        help="jobs killed right after their first searched record")
    parser.add_argument("--only", choices=("cli", "damage", "kills", "search-kills", "trust"),
                        action="append",
                        help="run only these parts (default: all)")
    args = parser.parse_args()
    parts = args.only or ["cli", "damage", "kills", "search-kills", "trust"]
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
        if "trust" in parts:
            report["trust"] = trust(work)
            print(json.dumps(report["trust"], indent=1), flush=True)
    report["cpu"] = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo"],
                                   capture_output=True, text=True).stdout.strip()
    args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
