"""ApplyDatabase: apply a tuning database's records to the kernels (after FuseTIR), a record
that is a measured hand-written seed replaced by its rule's schedule as the rule is now.

``tvmfuse tune`` records each kernel's hand-written schedule as a seed (its root block annotated
with the rule's name), then searches for faster ones. A seed replays the rule as it was when it
was recorded: once the rule improves, a database of seeds would keep the old schedule (a
ResNet-50 database of seeds ran a fifth slower than the rules it was recorded from had become). A
searched record stays as it was measured.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import tvm
from tvm import relax, tirx

from .. import names
from ..tuning import database as tuning_db
from .apply_schedule_rules import ApplyScheduleRules
from .prepack_weights import with_prepack_blocks

log = logging.getLogger(__name__)


@tvm.transform.module_pass(opt_level=0, name="ApplyDatabase")
class ApplyDatabase:
    """MetaScheduleApplyDatabase over ``database``, its seed records taken from ``scheduler``
    (the rules the build schedules with) as they schedule the kernel now."""

    def __init__(self, database: Path, scheduler: ApplyScheduleRules):
        self.database, self.scheduler = database, scheduler

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        try:
            applied = relax.transform.MetaScheduleApplyDatabase(str(self.database))(mod)
        except Exception:  # noqa: BLE001 - a record that does not replay fails the whole pass
            with tempfile.TemporaryDirectory(prefix="tvmfuse-db-") as scratch:
                if not _without_broken_records(Path(self.database), Path(scratch)):
                    raise
                applied = relax.transform.MetaScheduleApplyDatabase(scratch)(mod)
        target = tvm.target.Target.current()
        for gvar, func in list(applied.functions.items()):
            if not isinstance(func, tirx.PrimFunc) or gvar not in mod:
                continue
            space = root_annotation(func, names.SPACE)
            if space is not None:
                applied[gvar] = self._searched(func, mod[gvar], target, space, gvar.name_hint)
                continue
            rule = seed_rule(func)
            if rule is None:
                continue
            sch = hand_written(mod[gvar], target, self.scheduler, gvar.name_hint)
            if sch is None or seed_rule(sch.mod["main"]) != rule:
                continue  # the rule no longer takes it: the seed stays
            applied[gvar] = _with_attrs_of(sch.mod["main"], func)
        return applied

    def _searched(self, func: tirx.PrimFunc, unscheduled: tirx.PrimFunc, target, space: str,
                  kernel: str) -> tirx.PrimFunc:
        """A record from a rule's design space: applied with its packing blocks named for
        PrepackWeights, where the rule is still at the record's version; else the rule's
        schedule as it is now (the old trace's decisions would be replayed on the new rule's
        loops)."""
        name, version = names.parse_space(space)
        rule = self.scheduler.rule(name)
        if rule is not None and str(getattr(rule, "version", "")) == version:
            return with_prepack_blocks(func)
        log.warning("%s: its tuning record is from %s, which is now %s; scheduled by the rule "
                    "instead (tune it again)", kernel, space,
                    f"version {rule.version}" if rule is not None else "gone")
        sch = hand_written(unscheduled, target, self.scheduler, kernel)
        return func if sch is None else _with_attrs_of(sch.mod["main"], func)


def _with_attrs_of(fresh: tirx.PrimFunc, record: tirx.PrimFunc) -> tirx.PrimFunc:
    """``fresh`` (the rule's schedule now) with the attributes the database's record has."""
    for key, value in record.attrs.items():
        fresh = fresh.with_attr(key, value)
    return fresh


def _without_broken_records(folder: Path, scratch: Path) -> bool:
    """Write into ``scratch`` the records of ``folder`` whose trace replays on its workload (a
    record pasted onto another kernel's workload, or two workload lines swapped, fail
    MetaSchedule's whole pass); False when every record replays (the failure is elsewhere)."""
    db = tuning_db.read(folder)
    dropped = tuning_db.drop_not_replaying(db)
    if not dropped:
        return False
    log.warning("tuning database %s: %d record(s) do not replay on their kernel and are skipped "
                "(first: %s); `tvmfuse db purge` sets them aside", folder, dropped,
                db.problems[-dropped])
    db.problems = []
    tuning_db.write(db, scratch)
    return True


def hand_written(func: tirx.PrimFunc, target, scheduler: ApplyScheduleRules,
                 kernel: str = "main"):
    """The schedule the build would give ``func``, its root block annotated with the rule's name
    so that the schedule (and a database record's trace) says where it came from; None where no
    rule takes it. ``tvmfuse tune`` records these as seeds."""
    found = scheduler.schedule(func, target, kernel)
    if found is None:
        return None
    name, sch = found
    sch.annotate(sch.get_sblock("root"), names.SCHEDULE, name)
    return sch


def seed_rule(func: tirx.PrimFunc) -> str | None:
    """The hand-written rule a database record's schedule came from (``tvmfuse tune`` seeds
    annotate the root block with it), or None for a searched schedule."""
    return root_annotation(func, names.SCHEDULE)


def root_annotation(func: tirx.PrimFunc, key: str) -> str | None:
    """The value of the root block's annotation ``key``, or None."""
    block = getattr(func.body, "block", None)
    annotations = getattr(block, "annotations", None) or {}
    value = annotations.get(key)
    return None if value is None else str(value)
