"""tvmfuse's view of a MetaSchedule JSON database folder: read it line by line (a corrupt line is
a reported problem, never a failed load and never a shifted record), tell records of this target
from foreign ones, and rewrite it atomically under a lock (``tvmfuse db``, tuning jobs).

The folder holds MetaSchedule's two files: ``database_workload.json``, one ``[structural hash,
workload]`` per line, and ``database_tuning_record.json``, one ``[workload index, [trace, run
seconds, target, argument info]]`` per line, the index counting the workload file's lines.
MetaSchedule writes a candidate that failed to build or run with a run time of 1e10 s.

What keeps a record on its workload:

- **Reading** keeps each record with the workload *line* it names: a corrupt workload line still
  takes its place in the count, and the records that name it are set aside (quarantined), not
  handed the next workload. In memory a record points at its workload's content.
- **Writing** puts both files beside the old ones (``.<name>.new``, fsynced), then renames the
  workload file and then the record file into place. A crash between the two renames leaves the
  new record file waiting; every reader takes it over the old one, and the next writer finishes
  the rename. Readers hold the folder's lock shared, writers exclusive.
- **Nothing is deleted that was not asked for**: lines a rewrite cannot keep (corrupt ones,
  records whose workload line is corrupt or missing) are appended to ``database_quarantine.json``
  with the reason; ``tvmfuse db check`` names them.
- **Tuning jobs** (:mod:`tvmfuse.tuning.tune`) write every measured record at once into a
  private ``.tune-*`` folder whose lock they hold while they live; :func:`recover_jobs` merges
  the folders of jobs that died (``kill -9``) into the database.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import names
from ..errors import TvmfuseError, one_line

log = logging.getLogger(__name__)

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
FILES = (WORKLOADS, RECORDS)
#: Lines a rewrite could not keep, one JSON object per line: ``{"file", "line", "reason",
#: "text"}``. Never read by a build.
QUARANTINE = "database_quarantine.json"
#: MetaSchedule's run time for a candidate that failed to build or run.
FAILED_SECONDS = 1e9
#: The largest run time a sound record holds: MetaSchedule writes 1e10 s for a failed candidate;
#: anything above it, like NaN, infinity, zero or a negative time, was never measured.
MAX_SECONDS = 1e10
#: The target fields that decide whether a record applies (a record tuned for another CPU or
#: another core count is another machine's schedule).
TARGET_FIELDS = ("kind", "mcpu", "mtriple", "arch", "num-cores")
#: Prefix of a tuning job's private folder inside the database it tunes into.
JOB_PREFIX = ".tune-"
#: The lock file a live tuning job holds in its folder.
JOB_LOCK = ".owner"
#: Folders this process holds the writer's lock of (its reads need no shared lock: flock would
#: make a second lock of one process wait for its first).
_HELD: set[Path] = set()


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    message: str
    #: The line as it was (kept in the quarantine when the database is rewritten).
    text: str = ""

    def __str__(self) -> str:
        return f"{self.file} line {self.line}: {self.message}"


@dataclass
class Database:
    """The sound lines of one database folder (JSON values as MetaSchedule wrote them).

    ``workloads`` are ``[hash, workload]`` pairs, ``records`` ``[index, record]`` pairs whose
    index points into ``workloads`` (this list, not the file's lines: they are renumbered as
    they are read, and again when written)."""

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

    @property
    def sound(self) -> bool:
        return not self.problems


def has_database(folder: Path) -> bool:
    return all((Path(folder) / name).is_file() for name in FILES)


def digest(folder: Path) -> str:
    """The SHA-256 of the database in ``folder``: its files' contents, in :data:`FILES` order."""
    sha = hashlib.sha256()
    for name in FILES:
        sha.update((Path(folder) / name).read_bytes())
    return sha.hexdigest()


def require(folder: Path) -> None:
    """A TvmfuseError unless ``folder`` holds a tuning database (checked before anything is
    written into it, its lock included)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TvmfuseError(f"{folder} does not exist; name a tuning database folder")
    if not has_database(folder):
        raise TvmfuseError(f"{folder} is not a tuning database: it needs {' and '.join(FILES)}")


def _open_inside(path: Path, flags: int):
    """``os.open`` of a file of a database folder, refusing a symbolic link there: a link would
    take what tvmfuse writes (quarantined text someone else wrote, a lock) out of the folder."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        if path.is_symlink():
            raise TvmfuseError(f"{path} is a symbolic link; tvmfuse writes only files inside the "
                               f"database folder: remove the link") from None
        raise


def read(folder: Path) -> Database:
    """Parse ``folder``; lines that are not JSON or not of MetaSchedule's shape become problems,
    and so do records whose workload line is one (see the module docstring)."""
    folder = Path(folder)
    require(folder)
    with _shared_lock(folder):
        return _read(folder)


def _read(folder: Path) -> Database:
    db = Database(folder)
    slots: list[int | None] = []  # workload line (counted as MetaSchedule counts) -> our index
    known: dict[tuple, int] = {}
    for number, value, text in _lines(folder / WORKLOADS, db.problems):
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
            index = known.setdefault(tuple(value), len(db.workloads))
            if index == len(db.workloads):
                db.workloads.append(value)
            slots.append(index)
        else:
            if value is not None:
                db.problems.append(Problem(WORKLOADS, number, "not a [hash, workload] pair",
                                           text))
            slots.append(None)
    for number, value, text in _lines(_records_file(folder), db.problems, RECORDS):
        if value is None:
            continue
        if not _is_record(value):
            db.problems.append(Problem(RECORDS, number, "not a [workload, [trace, run "
                                                        "seconds, target, args]] record", text))
        elif not all(0 < s <= MAX_SECONDS for s in value[1][1]):
            db.problems.append(Problem(RECORDS, number, f"run time {value[1][1]} s is not a "
                                                        f"measured time", text))
        elif not 0 <= value[0] < len(slots):
            db.problems.append(Problem(RECORDS, number, f"workload {value[0]} does not exist",
                                       text))
        elif slots[value[0]] is None:
            db.problems.append(Problem(RECORDS, number, f"its workload (line {value[0] + 1} "
                                                        f"of {WORKLOADS}) is corrupt", text))
        else:
            db.records.append([slots[value[0]], value[1]])
    return db


def _records_file(folder: Path) -> Path:
    """The record file to read: a waiting ``.new`` one when a writer stopped between its two
    renames (its workload file is in place already)."""
    waiting = folder / f".{RECORDS}.new"
    return waiting if waiting.is_file() and not (folder / f".{WORKLOADS}.new").exists() \
        else folder / RECORDS


def _lines(path: Path, problems: list[Problem], name: str | None = None
           ) -> Iterator[tuple[int, object, str]]:
    """``(line number, JSON value or None when corrupt, text)`` for every line.

    A corrupt line yields None and still takes its place in the count (a workload's records
    name it by its position); a line that is not UTF-8 is corrupt, and so is a blank one:
    MetaSchedule writes none and cannot read a file that has one, so a blank line is a line whose
    content was lost."""
    name = name or path.name
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            text = raw.decode("utf-8", errors="replace").rstrip("\n")
            if not text.strip():
                problems.append(Problem(name, number, "blank line", text))
                yield number, None, text
                continue
            try:
                yield number, json.loads(raw.decode("utf-8")), text
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                message = getattr(err, "msg", "not UTF-8")
                problems.append(Problem(name, number, f"not valid JSON ({message})", text))
                yield number, None, text


def _is_record(value) -> bool:
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int)
            and isinstance(value[1], list) and len(value[1]) == 4
            and isinstance(value[1][1], list) and isinstance(value[1][2], dict)
            and all(isinstance(s, (int, float)) for s in value[1][1]))


def target_summary(target: dict) -> str:
    """The fields of a record's target that decide where it applies, as one JSON string."""
    return json.dumps({k: target[k] for k in TARGET_FIELDS if k in target}, sort_keys=True)


def same_target(record_target: dict, target: dict) -> bool:
    """Whether a record tuned for ``record_target`` applies to ``target`` (TVM target dicts)."""
    return all(str(record_target.get(k, "")) == str(target.get(k, "")) for k in TARGET_FIELDS
               if k in record_target or k in target)


@contextlib.contextmanager
def locked(folder: Path, create: bool = True) -> Iterator[None]:
    """Hold ``folder``'s lock exclusively: one writer at a time (tuning jobs, ``tvmfuse db``).
    ``create`` makes the folder when it is missing (a merge's destination)."""
    folder = Path(folder)
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    elif not folder.is_dir():
        raise TvmfuseError(f"{folder} does not exist; name a tuning database folder")
    try:
        lock = os.fdopen(_open_inside(folder / ".lock", os.O_WRONLY | os.O_APPEND | os.O_CREAT),
                         "a")
    except OSError as err:
        raise TvmfuseError(f"cannot write to tuning database {folder} ({err.strerror}); "
                           f"copy it somewhere writable, or name another with --db") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _HELD.add(folder.resolve())
        try:
            _finish_commit(folder)
            yield
        finally:
            _HELD.discard(folder.resolve())
            fcntl.flock(lock, fcntl.LOCK_UN)


def held() -> set[Path]:
    """The database folders whose writer's lock this process holds."""
    return set(_HELD)


@contextlib.contextmanager
def _shared_lock(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s lock shared while reading, so no rewrite is seen half done. A folder
    nobody may write (a shipped database) has no writers to wait for."""
    if folder.resolve() in _HELD:
        yield
        return
    try:
        lock = os.fdopen(_open_inside(folder / ".lock", os.O_WRONLY | os.O_APPEND | os.O_CREAT),
                         "a")
    except (OSError, TvmfuseError):
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write(db: Database, folder: Path | None = None) -> None:
    """Write ``db`` into ``folder`` (default: where it came from), both files replaced as the
    module docstring says; ``db``'s problems go to the quarantine. The caller holds the lock."""
    folder = Path(folder or db.folder)
    folder.mkdir(parents=True, exist_ok=True)
    if db.problems:
        _quarantine(folder, db.problems)
        db.problems = []
    rows = {WORKLOADS: db.workloads, RECORDS: db.records}
    for name in FILES:  # both written and on disk before either replaces the old one
        (folder / f".{name}.new").unlink(missing_ok=True)  # a link there is not followed
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        with os.fdopen(_open_inside(folder / f".{name}.new", flags), "w", encoding="utf-8") as f:
            for row in rows[name]:
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(folder / f".{name}.new", 0o644)
    for name in FILES:
        os.replace(folder / f".{name}.new", folder / name)
        _fsync_dir(folder)


def _finish_commit(folder: Path) -> None:
    """Under the writer's lock: finish or undo a rewrite that stopped part way."""
    new = {name: folder / f".{name}.new" for name in FILES}
    if new[WORKLOADS].exists():  # stopped before the first rename: the old files are whole
        for path in new.values():
            path.unlink(missing_ok=True)
    elif new[RECORDS].exists():  # stopped between the renames: the new workloads are in place
        os.replace(new[RECORDS], folder / RECORDS)
        _fsync_dir(folder)
        log.warning("tuning database %s: finished a rewrite that had stopped half way", folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _quarantine(folder: Path, problems: list[Problem]) -> None:
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    with os.fdopen(_open_inside(folder / QUARANTINE, flags), "a", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps({"file": p.file, "line": p.line, "reason": p.message,
                                "text": p.text}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def quarantined(folder: Path) -> int:
    """How many lines earlier rewrites of ``folder`` set aside."""
    path = Path(folder) / QUARANTINE
    if not path.is_file():
        return 0
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def merge_into(dest: Database, source: Database) -> int:
    """Add ``source``'s records to ``dest``, workloads deduplicated by their content; returns the
    number of records added (identical records are not added twice)."""
    index = {tuple(w): i for i, w in enumerate(dest.workloads)}
    seen = {json.dumps([dest.workloads[r[0]], r[1]], sort_keys=True) for r in dest.records}
    added = 0
    for record in source.records:
        workload = tuple(source.workloads[record[0]])
        key = json.dumps([list(workload), record[1]], sort_keys=True)
        if key in seen:
            continue
        if workload not in index:
            index[workload] = len(dest.workloads)
            dest.workloads.append(list(workload))
        seen.add(key)
        dest.records.append([index[workload], record[1]])
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


def merge_folders(sources: list[Path], into: Path, keep_skipped: bool = False) -> Merged:
    """Add the records of every database in ``sources`` into ``into`` (created when missing),
    under its lock; every source is read before anything is written. ``keep_skipped`` sets the
    sources' unusable lines aside in ``into``'s quarantine (for sources deleted afterwards)."""
    parsed = [read(source) for source in sources]
    with locked(into):
        dest = read(into) if has_database(into) else Database(into)
        added = {str(source.folder): merge_into(dest, source) for source in parsed}
        if keep_skipped:
            dest.problems += [replace(p, file=f"{source.folder.name}/{p.file}")
                              for source in parsed for p in source.problems]
        if any(added.values()) or dest.problems or not has_database(into):
            write(dest, into)
    skipped = [f"{source.folder}: {problem}" for source in parsed for problem in source.problems]
    return Merged(added, len(dest.workloads), len(dest.records), skipped)


def purge(db: Database, target: dict | None = None) -> dict[str, int]:
    """Drop failed records, and records of other targets when ``target`` is given; workloads
    left without records go too. Returns what was dropped, by reason. Corrupt lines were never
    read into ``db``: :func:`write` sets them aside in the quarantine."""
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
    return dropped


def usable(folders: Path | tuple[Path, ...] | list[Path], target: dict,
           scratch: Path) -> Path | None:
    """The database a build for ``target`` should apply, from ``folders`` in order: a kernel
    with a record in an earlier folder takes only that folder's records (the user's over the
    shipped ones). ``folders`` itself when it is one folder, every line sound and every record
    this target's; otherwise what is left of them in ``scratch``, each kind of problem logged
    once. None when no record of ``target`` is left."""
    folders = [Path(folders)] if isinstance(folders, (str, Path)) else [Path(f) for f in folders]
    if not folders:
        return None
    parsed = [read(folder) for folder in folders]
    clean = True
    for db in parsed:
        clean &= _report(db, target)
    if clean and len(parsed) == 1:
        return folders[0]
    combined = Database(Path(scratch))
    covered: set[tuple] = set()
    for db in parsed:
        purge(db, target)
        mine = Database(db.folder, db.workloads, [r for r in db.records
                                                  if tuple(db.workloads[r[0]]) not in covered])
        merge_into(combined, mine)
        covered |= {tuple(w) for w in db.workloads}
    if not combined.records:
        return None
    write(combined, scratch)
    return Path(scratch)


def _report(db: Database, target: dict) -> bool:
    """Log what a build leaves out of ``db``; True when it leaves nothing out."""
    if db.problems:
        first = db.problems[0]
        log.warning("tuning database %s: %d line(s) unusable and skipped (first: %s); "
                    "`tvmfuse db check %s` lists them", db.folder, len(db.problems), first,
                    db.folder)
    foreign = [r for r in db.records if not same_target(db.target_of(r), target)]
    if foreign:
        kinds = sorted({target_summary(db.target_of(r)) for r in foreign})
        log.warning("tuning database %s: %d record(s) for another target (%s) are not applied",
                    db.folder, len(foreign), "; ".join(kinds))
    return not db.problems and not foreign


# --- tuning jobs ---------------------------------------------------------------------------


@contextlib.contextmanager
def job_folder(database_dir: Path) -> Iterator[Path]:
    """A private folder for one tuning job inside ``database_dir``, locked for the job's life:
    a folder whose lock can be taken belongs to a job that is gone (:func:`recover_jobs`)."""
    folder = Path(tempfile.mkdtemp(prefix=JOB_PREFIX, dir=database_dir))
    with open(folder / JOB_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield folder


def leftover_jobs(database_dir: Path) -> list[Path]:
    """The ``.tune-*`` folders in ``database_dir`` whose job is no longer running."""
    found = []
    for folder in sorted(Path(database_dir).glob(f"{JOB_PREFIX}*")):
        # a link is not a job's folder: following it would merge and lock another folder
        if folder.is_dir() and not folder.is_symlink() and not _alive(folder):
            found.append(folder)
    return found


def _alive(job: Path) -> bool:
    try:
        with os.fdopen(_open_inside(job / JOB_LOCK, os.O_WRONLY | os.O_APPEND | os.O_CREAT),
                       "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(lock, fcntl.LOCK_UN)
            return False
    except (OSError, TvmfuseError):
        return False


def job_databases(job: Path) -> list[Path]:
    """Every database folder a job wrote: its own, and one per task it searched."""
    return [f for f in [job, *sorted(job.glob("search-*"))]
            if not f.is_symlink() and has_database(f)]


def merge_job(job: Path, database_dir: Path) -> int:
    """Merge what a job wrote (its seeds and every task's search) into ``database_dir`` and
    remove the job's folder; returns the number of records added. A merge that fails leaves the
    folder, for :func:`recover_jobs`."""
    sources = job_databases(job)
    added = (sum(merge_folders(sources, database_dir, keep_skipped=True).added.values())
             if sources else 0)
    shutil.rmtree(job, ignore_errors=True)
    return added


def recover_jobs(database_dir: Path) -> int:
    """Merge the records of tuning jobs that died (killed, power lost) into ``database_dir`` and
    remove their folders; returns the number of records recovered."""
    recovered = 0
    for job in leftover_jobs(database_dir):
        count = merge_job(job, database_dir)
        recovered += count
        log.warning("recovered %d record(s) from an interrupted tuning job (%s) into %s",
                    count, job.name, database_dir)
    return recovered


# --- what `tvmfuse db` reports -------------------------------------------------------------


def stats(db: Database, target: dict | None = None) -> dict:
    """Workloads, records (failed ones, per target, foreign to ``target``), best times and the
    problems of ``db``, with leftover tuning jobs and quarantined lines of its folder."""
    targets = collections.Counter(target_summary(db.target_of(r)) for r in db.records)
    foreign = 0 if target is None else sum(
        not same_target(db.target_of(r), target) for r in db.records)
    best = db.best_seconds()
    return {
        "folder": str(db.folder),
        "workloads": len(db.workloads),
        "records": len(db.records),
        "failed_records": sum(db.failed(r) for r in db.records),
        "workloads_with_a_working_record": len(best),
        "targets": dict(targets),
        "origins": dict(collections.Counter(origin(r) for r in db.records)),
        "foreign_records": foreign,
        "problems": [str(p) for p in db.problems],
        "leftover_jobs": [job.name for job in leftover_jobs(db.folder)],
        "quarantined_lines": quarantined(db.folder),
        "best_ms": {str(i): round(s * 1e3, 4) for i, s in sorted(best.items())},
    }


def origin(record: list) -> str:
    """Where a record's schedule came from, by the annotations of its trace: ``seed:<rule>`` (a
    hand-written seed), ``space:<rule>@<version>`` (a rule's design space) or ``generic``
    (MetaSchedule's generic space)."""
    found = {}
    try:
        # the trace's instructions, [kind, inputs, attrs, outputs]; an annotation's key is its
        # attribute, its value the second input (a JSON string, quoted)
        for kind, inputs, attrs, _ in record[1][0][0]:
            if kind == "Annotate" and attrs and attrs[0] in (names.SCHEDULE, names.SPACE):
                found[attrs[0]] = str(inputs[1]).strip('"')
    except (TypeError, ValueError, IndexError):
        return "unknown"
    if names.SCHEDULE in found:
        return f"seed:{found[names.SCHEDULE]}"
    if names.SPACE in found:
        return f"space:{found[names.SPACE]}"
    return "generic"


def replay(db: Database) -> list[str]:
    """Every record whose trace does not replay on its workload (a record of another TVM, or
    attached to the wrong workload), named by its workload and record position. Loads TVM."""
    return [f"record {number} (workload {db.records[number - 1][0]}): its trace does not replay "
            f"({message})" for number, message in not_replaying(db)]


def not_replaying(db: Database) -> list[tuple[int, str]]:
    """``(record number from 1, why)`` for every record of ``db`` whose trace does not replay
    on its workload. Loads TVM."""
    from tvm import s_tir  # noqa: PLC0415 - only this check needs TVM; `db stats` stays light
    from tvm.s_tir import meta_schedule as ms  # noqa: PLC0415

    failures = []
    workloads: dict[int, object] = {}
    for number, (index, body) in enumerate(db.records, 1):
        try:
            if index not in workloads:
                workloads[index] = ms.database.Workload.from_json(db.workloads[index])
            record = ms.database.TuningRecord.from_json(body, workloads[index])
            record.trace.apply_to_schedule(s_tir.Schedule(workloads[index].mod),
                                           remove_postproc=True)
        except Exception as err:  # noqa: BLE001 - any failure is the finding
            failures.append((number, one_line(err, 160)))
    return failures


def drop_not_replaying(db: Database) -> int:
    """Move the records of ``db`` whose trace does not replay to its problems (the quarantine,
    once written); returns how many."""
    failures = dict(not_replaying(db))
    for number in sorted(failures):
        index, body = db.records[number - 1]
        db.problems.append(Problem(RECORDS, number, f"its trace does not replay on its workload "
                                                    f"({failures[number]})",
                                   json.dumps([index, body], separators=(",", ":"))))
    db.records = [r for n, r in enumerate(db.records, 1) if n not in failures]
    return len(failures)
