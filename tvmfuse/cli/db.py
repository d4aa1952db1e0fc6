"""``tvmfuse db``: look after tuning databases. ``stats`` counts workloads, records and targets;
``check`` names every line that is not a sound record, every record whose trace does not replay
on its workload, records of another target (with ``--target``) and tuning jobs that were killed
before they merged, and exits 1 if it finds one; ``purge`` removes failed candidates, corrupt
lines (kept in ``database_quarantine.json``) and, with ``--target``, other targets' records;
``recover`` merges the records of killed tuning jobs; ``merge`` adds databases into one.
Rewrites are atomic and hold the database's lock, so they are safe next to a running
``tvmfuse tune``."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from ..errors import TvmfuseError
from ..targets import check_name, get_target
from ..tuning import database

log = logging.getLogger(__name__)


def add_parser(sub) -> None:
    parser = sub.add_parser("db", help="stats, check, purge, recover or merge tuning databases",
                            description=__doc__)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (("stats", "workloads, records, targets and best times"),
                       ("check", "report corrupt lines, records that do not replay, foreign "
                                 "records and killed jobs; exit 1 if any"),
                       ("purge", "remove failed records, corrupt lines, foreign records"),
                       ("recover", "merge the records of killed tuning jobs")):
        action = actions.add_parser(name, help=text)
        action.add_argument("folder", type=Path, help="database folder")
        action.add_argument("--target", metavar="TARGET",
                            help="treat records of any other target as foreign")
        action.add_argument("--json", action="store_true", help="print JSON for scripts")
    merge = actions.add_parser("merge", help="add the records of SOURCE... into INTO")
    merge.add_argument("sources", type=Path, nargs="+", metavar="SOURCE")
    merge.add_argument("--into", type=Path, required=True, metavar="INTO",
                       help="database folder to merge into (created if missing)")
    merge.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    target = None
    if getattr(args, "target", None):
        target = get_target(check_name(args.target)).config
    if args.action == "merge":
        result = _merge(args.sources, args.into)
    elif args.action == "recover":
        with database.locked(args.folder, create=False):
            pass  # finishes a rewrite that stopped half way
        result = {"folder": str(args.folder),
                  "recovered": database.recover_jobs(args.folder)}
    elif args.action == "purge":
        database.require(args.folder)  # before its lock is created in a folder of other files
        with database.locked(args.folder, create=False):
            db = database.read(args.folder)
            result = {"folder": str(args.folder), "dropped": database.purge(db, target),
                      "quarantine": str(args.folder / database.QUARANTINE)}
            result["dropped"]["not replaying"] = database.drop_not_replaying(db)
            database.write(db)
            result["kept"] = {"workloads": len(db.workloads), "records": len(db.records)}
    else:
        # a database whose only content is a killed job's folder is still worth a report
        empty = (args.folder.is_dir() and not database.has_database(args.folder)
                 and database.leftover_jobs(args.folder))
        db = database.Database(args.folder) if empty else database.read(args.folder)
        result = database.stats(db, target)
        if args.action == "check":
            result["problems"] += database.replay(db)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(args.action, result)
    if args.action == "check" and (result["problems"] or result["foreign_records"]
                                   or result["leftover_jobs"]):
        return 1
    return 0


def _merge(sources: list[Path], into: Path) -> dict:
    for source in sources:
        if source.resolve() == into.resolve():
            raise TvmfuseError(f"{source} is the database merged into; name it once, as --into")
    merged = database.merge_folders(sources, into)
    for line in merged.skipped:
        log.warning("skipped %s", line)
    return {"into": str(into), "added": merged.added, "skipped": merged.skipped,
            "workloads": merged.workloads, "records": merged.records}


def _print(action: str, result: dict) -> None:
    if action == "merge":
        for source, n in result["added"].items():
            print(f"{source}: {n} record(s) added")
        print(f"{result['into']}: {result['workloads']} workloads, {result['records']} records")
        return
    if action == "recover":
        print(f"{result['folder']}: {result['recovered']} record(s) recovered from killed "
              f"tuning jobs")
        return
    if action == "purge":
        dropped = ", ".join(f"{n} {why}" for why, n in result["dropped"].items())
        print(f"{result['folder']}: dropped {dropped}; kept {result['kept']['workloads']} "
              f"workloads, {result['kept']['records']} records")
        if result["dropped"]["corrupt lines"] or result["dropped"]["not replaying"]:
            print(f"  corrupt lines kept in {result['quarantine']}")
        return
    print(f"{result['folder']}: {result['workloads']} workloads, {result['records']} records "
          f"({result['failed_records']} failed), {result['workloads_with_a_working_record']} "
          f"workloads with a working record")
    for target, n in result["targets"].items():
        print(f"  target {target}: {n} record(s)")
    if result["origins"]:
        print("  records by origin: " + ", ".join(
            f"{origin} {n}" for origin, n in sorted(result["origins"].items())))
    if result["foreign_records"]:
        print(f"  {result['foreign_records']} record(s) for another target")
    for problem in result["problems"]:
        print(f"  problem: {problem}")
    for job in result["leftover_jobs"]:
        print(f"  tuning job {job} was killed before it merged its records; `tvmfuse db recover "
              f"{result['folder']}` (or the next `tvmfuse tune` on it) merges them")
    if result["quarantined_lines"]:
        print(f"  {result['quarantined_lines']} line(s) set aside by earlier rewrites in "
              f"{database.QUARANTINE}")
