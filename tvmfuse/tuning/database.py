"""tvmfuse's view of a MetaSchedule JSON database folder: read it line by line (a corrupt line is
a reported problem, not a failed load), tell records of this target from foreign ones, and
rewrite it atomically under a lock (stats, check, purge, merge; ``tvmfuse db``).

The folder holds MetaSchedule's two files: ``database_workload.json``, one ``[structural hash,
workload]`` per line, and ``database_tuning_record.json``, one ``[workload index, [trace,
run seconds, target, argument info]]`` per line. MetaSchedule writes a candidate that failed to
build or run with a run time of 1e10 s.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TvmfuseError

log = logging.getLogger(__name__)

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
FILES = (WORKLOADS, RECORDS)
#: MetaSchedule's run time for a candidate that failed to build or run.
FAILED_SECONDS = 1e9
#: The target fields that decide whether a record applies (a record tuned for another CPU or
#: another core count is another machine's schedule).
TARGET_FIELDS = ("kind", "mcpu", "mtriple", "arch", "num-cores")


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file} line {self.line}: {self.message}"


@dataclass
class Database:
    """The parsed lines of one database folder (JSON values as MetaSchedule wrote them)."""

    folder: Path
    workloads: list[list] = field(default_factory=list)
    records: list[list] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def target_of(self, record: list) -> dict:
        return record[1][2]

    def failed(self, record: list) -> bool:
        run_secs = record[1][1]
        return not run_secs or min(run_secs) >= FAILED_SECONDS

    def best_seconds(self) -> dict[int, float]:
        """Workload index -> the best run time among its successful records."""
        best: dict[int, float] = {}
        for record in self.records:
            if not self.failed(record):
                seconds = sum(record[1][1]) / len(record[1][1])
                best[record[0]] = min(best.get(record[0], seconds), seconds)
        return best


def has_database(folder: Path) -> bool:
    return all((folder / name).is_file() for name in FILES)


def read(folder: Path) -> Database:
    """Parse ``folder``; lines that are not JSON or not of MetaSchedule's shape become problems."""
    folder = Path(folder)
    if not has_database(folder):
        raise TvmfuseError(f"{folder} is not a tuning database: it needs {' and '.join(FILES)}")
    db = Database(folder)
    for number, value in _lines(folder / WORKLOADS, db.problems):
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
            db.workloads.append(value)
        else:
            db.problems.append(Problem(WORKLOADS, number, "not a [hash, workload] pair"))
    for number, value in _lines(folder / RECORDS, db.problems):
        if not _is_record(value):
            db.problems.append(Problem(RECORDS, number, "not a [workload, [trace, run "
                                                        "seconds, target, args]] record"))
        elif not 0 <= value[0] < len(db.workloads):
            db.problems.append(Problem(RECORDS, number, f"workload {value[0]} does not exist"))
        else:
            db.records.append(value)
    return db


def _lines(path: Path, problems: list[Problem]) -> Iterator[tuple[int, object]]:
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as err:
                problems.append(Problem(path.name, number, f"not valid JSON ({err.msg})"))


def _is_record(value) -> bool:
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int)
            and isinstance(value[1], list) and len(value[1]) == 4
            and isinstance(value[1][1], list) and isinstance(value[1][2], dict))


def target_summary(target: dict) -> str:
    """The fields of a record's target that decide where it applies, as one JSON string."""
    return json.dumps({k: target[k] for k in TARGET_FIELDS if k in target}, sort_keys=True)


def same_target(record_target: dict, target: dict) -> bool:
    """Whether a record tuned for ``record_target`` applies to ``target`` (TVM target dicts)."""
    return all(str(record_target.get(k, "")) == str(target.get(k, "")) for k in TARGET_FIELDS
               if k in record_target or k in target)


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s lock: one writer at a time (tuning jobs, ``tvmfuse db``)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write(db: Database, folder: Path | None = None) -> None:
    """Write ``db`` into ``folder`` (default: where it came from), each file replaced atomically.
    The caller holds the lock."""
    folder = Path(folder or db.folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in ((WORKLOADS, db.workloads), (RECORDS, db.records)):
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / name)


def merge_into(dest: Database, source: Database) -> int:
    """Add ``source``'s records to ``dest``, workloads deduplicated by their JSON; returns the
    number of records added (identical records are not added twice)."""
    index = {tuple(w): i for i, w in enumerate(dest.workloads)}
    seen = {json.dumps(r, sort_keys=True) for r in dest.records}
    added = 0
    for record in source.records:
        workload = tuple(source.workloads[record[0]])
        if workload not in index:
            index[workload] = len(dest.workloads)
            dest.workloads.append(list(workload))
        moved = [index[workload], record[1]]
        key = json.dumps(moved, sort_keys=True)
        if key not in seen:
            seen.add(key)
            dest.records.append(moved)
            added += 1
    return added


@dataclass
class Merged:
    """What :func:`merge_folders` did: records added per source, the result's size, and the
    sources' lines it skipped."""

    added: dict[str, int]
    workloads: int
    records: int
    skipped: list[str]


def merge_folders(sources: list[Path], into: Path) -> Merged:
    """Add the records of every database in ``sources`` into ``into`` (created when missing),
    under its lock; every source is read before anything is written."""
    parsed = [read(source) for source in sources]
    with locked(into):
        dest = read(into) if has_database(into) else Database(into)
        added = {str(source.folder): merge_into(dest, source) for source in parsed}
        write(dest, into)
    skipped = [f"{source.folder}: {problem}" for source in parsed for problem in source.problems]
    return Merged(added, len(dest.workloads), len(dest.records), skipped)


def purge(db: Database, target: dict | None = None) -> dict[str, int]:
    """Drop failed records, and records of other targets when ``target`` is given; workloads
    left without records go too. Returns what was dropped, by reason. (Corrupt lines were never
    read into ``db``: writing it back drops them.)"""
    dropped = {"failed": 0, "other target": 0, "corrupt lines": len(db.problems)}
    kept = []
    for record in db.records:
        if db.failed(record):
            dropped["failed"] += 1
        elif target is not None and not same_target(db.target_of(record), target):
            dropped["other target"] += 1
        else:
            kept.append(record)
    used = sorted({r[0] for r in kept})
    renumber = {old: new for new, old in enumerate(used)}
    dropped["workloads without records"] = len(db.workloads) - len(used)
    db.workloads = [db.workloads[i] for i in used]
    db.records = [[renumber[r[0]], r[1]] for r in kept]
    db.problems = []
    return dropped


def usable(folder: Path, target: dict, scratch: Path) -> Path | None:
    """The database a build for ``target`` should apply: ``folder`` itself when every line is
    sound and every record is this target's; otherwise a cleaned copy in ``scratch``, each
    problem logged with its file and line. None when no record of ``target`` is left."""
    db = read(folder)
    for problem in db.problems:
        log.warning("tuning database %s: %s; skipping it (`tvmfuse db purge %s` removes it)",
                    folder, problem, folder)
    foreign = [r for r in db.records if not same_target(db.target_of(r), target)]
    if foreign:
        kinds = sorted({target_summary(db.target_of(r)) for r in foreign})
        log.warning("tuning database %s: %d record(s) for another target (%s) are not applied",
                    folder, len(foreign), "; ".join(kinds))
    if not db.problems and not foreign:
        return folder
    purge(db, target)
    if not db.records:
        return None
    write(db, scratch)
    return scratch
