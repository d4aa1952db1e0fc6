"""``tvmfuse db``: look after tuning databases. ``stats`` counts workloads, records and targets;
``check`` names every line that is not a sound record (and, with ``--target``, every record of
another target) and exits 1 if it finds one; ``purge`` removes failed candidates, corrupt lines and,
with ``--target``, other targets' records; ``merge`` adds databases into one. Rewrites are atomic
and hold the database's lock, so they are safe next to a running ``tvmfuse tune``."""

from __future__ import annotations

import argparse
import collections
import json
import logging
from pathlib import Path

from ..errors import TvmfuseError

log = logging.getLogger(__name__)


def add_parser(sub) -> None:
    parser = sub.add_parser("db", help="stats, check, purge or merge tuning databases",
                            description=__doc__)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (("stats", "workloads, records, targets and best times"),
                       ("check", "report corrupt lines and foreign records; exit 1 if any"),
                       ("purge", "remove failed records, corrupt lines, foreign records")):
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
    from ..tuning import database  # noqa: PLC0415

    target = None
    if getattr(args, "target", None):
        from ..targets import get_target  # noqa: PLC0415

        target = get_target(args.target).config
    if args.action == "merge":
        result = _merge(database, args.sources, args.into)
    elif args.action == "purge":
        with database.locked(args.folder):
            db = database.read(args.folder)
            result = {"folder": str(args.folder), "dropped": database.purge(db, target)}
            database.write(db)
            result["kept"] = {"workloads": len(db.workloads), "records": len(db.records)}
    else:
        result = _stats(database, database.read(args.folder), target)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(args.action, result)
    if args.action == "check" and (result["problems"] or result["foreign_records"]):
        return 1
    return 0


def _stats(database, db, target) -> dict:
    targets = collections.Counter(database.target_summary(db.target_of(r)) for r in db.records)
    foreign = 0 if target is None else sum(
        not database.same_target(db.target_of(r), target) for r in db.records)
    best = db.best_seconds()
    return {
        "folder": str(db.folder),
        "workloads": len(db.workloads),
        "records": len(db.records),
        "failed_records": sum(db.failed(r) for r in db.records),
        "workloads_with_a_working_record": len(best),
        "targets": dict(targets),
        "foreign_records": foreign,
        "problems": [str(p) for p in db.problems],
        "best_ms": {str(i): round(s * 1e3, 4) for i, s in sorted(best.items())},
    }


def _merge(database, sources: list[Path], into: Path) -> dict:
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
    if action == "purge":
        dropped = ", ".join(f"{n} {why}" for why, n in result["dropped"].items())
        print(f"{result['folder']}: dropped {dropped}; kept {result['kept']['workloads']} "
              f"workloads, {result['kept']['records']} records")
        return
    print(f"{result['folder']}: {result['workloads']} workloads, {result['records']} records "
          f"({result['failed_records']} failed), {result['workloads_with_a_working_record']} "
          f"workloads with a working record")
    for target, n in result["targets"].items():
        print(f"  target {target}: {n} record(s)")
    if result["foreign_records"]:
        print(f"  {result['foreign_records']} record(s) for another target")
    for problem in result["problems"]:
        print(f"  problem: {problem}")
