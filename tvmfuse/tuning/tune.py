"""Tune a model's fused kernels with MetaSchedule (XGBoost cost model) into a JSON database.

Tasks are the PrimFuncs the tvmfuse pipeline produces (after FuseTIR), deduplicated by structure,
so every launch of the same kernel shape is tuned once. They are ordered by their estimated share
of the model's FLOPs; a task the database already holds a record for is skipped unless asked to
retune. Records are appended to the database as they are measured, so an interrupted run keeps
them and a re-run resumes.

Measured here: MetaSchedule's default builder re-imports ``tvm.s_tir.tensor_intrin`` in every
worker (about 22 s on this 2-core machine) and times out; the builder below imports it once per
worker and allows 120 s.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import TvmfuseError
from . import database

log = logging.getLogger(__name__)


@dataclass
class TaskPlan:
    """One tuning task: a distinct fused kernel, how often it runs and how much work it is."""

    name: str
    launches: int
    flops: float  # per launch
    tuned: bool  # the database already holds a record for it

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _import_tensor_intrin() -> None:
    """Builder-worker initializer: pay for the tensor-intrinsic registry once per worker."""
    import tvm.s_tir.tensor_intrin  # noqa: F401, PLC0415


def plan_tasks(mod, target, database):
    """The tasks of ``mod`` (a module after FuseTIR), largest share of FLOPs first, with plans."""
    from tvm.s_tir import meta_schedule as ms  # noqa: PLC0415
    from tvm.s_tir.analysis import estimate_tir_flops  # noqa: PLC0415

    tasks = ms.relax_integration.extract_tasks(mod, target)
    plans = []
    for task in tasks:
        workload = task.dispatched[0]
        record = database.query_tuning_record(workload, target, task.task_name)
        plans.append(TaskPlan(task.task_name, int(task.weight),
                              float(estimate_tir_flops(workload)), record is not None))
    order = sorted(range(len(tasks)), key=lambda i: -plans[i].launches * plans[i].flops)
    return [tasks[i] for i in order], [plans[i] for i in order]


def tune(mod, target, database_dir: Path, *, trials: int, trials_per_iter: int = 4,
         retune: bool = False, only: list[str] | None = None) -> list[TaskPlan]:
    """Tune the kernels of ``mod`` (after FuseTIR) for ``target`` into ``database_dir``;
    ``only`` restricts the run to the named kernels.

    Returns the plan it worked from (``tuned`` as it was before this run).
    """
    from tvm.s_tir import meta_schedule as ms  # noqa: PLC0415

    database_dir.mkdir(parents=True, exist_ok=True)
    existing = ms.database.JSONDatabase(work_dir=str(database_dir))
    tasks, plans = plan_tasks(mod, target, existing)
    total = sum(p.launches * p.flops for p in plans) or 1.0
    for plan in plans:
        log.info("task %-60s x%d  %5.1f%% of FLOPs%s", plan.name, plan.launches,
                 100 * plan.launches * plan.flops / total, "  (in the database)" if plan.tuned else "")
    if only is not None:
        unknown = sorted(set(only) - {p.name for p in plans})
        if unknown:
            raise TvmfuseError(f"no kernel named {unknown[0]!r} to tune; kernels are: "
                               f"{', '.join(p.name for p in plans)}")
    todo = [(t, p) for t, p in zip(tasks, plans)
            if (retune or not p.tuned) and (only is None or p.name in only)]
    if not todo:
        log.info("every task has a record in %s; nothing to tune (--retune to search again)",
                 database_dir)
        return plans
    log.info("tuning %d of %d task(s), %d trials in all, %d per task per round", len(todo),
             len(tasks), trials, trials_per_iter)
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
        [t for t, _ in todo], work_dir=str(database_dir)
    )
    start = time.perf_counter()
    # MetaSchedule appends to its files as it goes and numbers workloads in memory, so two jobs
    # appending to one database would corrupt it. Each job tunes into a private folder, merged
    # into the database under its lock when the job ends, Ctrl-C included.
    staging = Path(tempfile.mkdtemp(prefix=".tune-", dir=database_dir))
    try:
        ms.tune_tasks(
            tasks=contexts,
            task_weights=weights,
            work_dir=str(database_dir),  # MetaSchedule's logs
            max_trials_global=trials,
            num_trials_per_iter=trials_per_iter,
            builder=ms.builder.LocalBuilder(max_workers=1, timeout_sec=120,
                                            initializer=_import_tensor_intrin),
            runner=ms.runner.LocalRunner(timeout_sec=60),
            database=ms.database.JSONDatabase(work_dir=str(staging)),
            cost_model="xgb",
        )
    finally:
        added = _merge_staging(staging, database_dir)
        log.info("tuned for %.0f s; %d record(s) added to %s", time.perf_counter() - start,
                 added, database_dir)
    return plans


def _merge_staging(staging: Path, database_dir: Path) -> int:
    try:
        if not database.has_database(staging):
            return 0
        with database.locked(database_dir):
            merged = database.read(database_dir)
            added = database.merge_into(merged, database.read(staging))
            database.write(merged)
        return added
    finally:
        shutil.rmtree(staging, ignore_errors=True)
