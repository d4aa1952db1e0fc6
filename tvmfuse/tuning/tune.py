"""Tune a model's fused kernels into a JSON database: hand-written seeds first, then a search
of each rule's design space (MetaSchedule's evolutionary search, XGBoost cost model) over the
kernels that take the most time.

Tasks are the PrimFuncs the tvmfuse pipeline produces (after FuseTIR), deduplicated by structure,
so every launch of the same kernel shape is tuned once, across models too (a workload already in
the database is not measured again).

1. **Seed.** Every task without a record gets the hand-written schedule the build would give it
   (:mod:`tvmfuse.schedules`), timed as the build runs it (:mod:`.measure`) and recorded with a
   trace that carries the rule's name. The database then covers every kernel.
2. **Plan.** Tasks are ordered by their measured share of the model's time (seed time x launches);
   the ``top_k`` largest are searched, the trials split between them, within ``budget_s`` of wall
   clock when given. The plan is logged first, with an ETA from the measured cost of a trial.
3. **Search**, one task at a time (:mod:`.search`): the design space of the rule that schedules
   the kernel, or MetaSchedule's generic space where the rule has none; every candidate is timed
   as the seed was. Then the best candidates and the kernel's schedule are timed again,
   alternately, and a candidate is recorded only where it beats the schedule by more than the
   spread of the timings; each kernel's seed time, best searched time and gain are logged.

Each job writes what it records at once into a private folder (merged into the database under
its lock when the job ends, Ctrl-C and SIGTERM included); every searched candidate goes to a
database of its own under the job's folder, kept in the database's ``logs/`` folder afterwards
(never applied: the search's timings are not the verified ones). A job killed outright
(``kill -9``, power lost) leaves its folder, locked only while the job lives: the next job on that
database, or ``tvmfuse db check``/``recover``, merges it and says so.

The database is read through :func:`tvmfuse.tuning.database.usable` (corrupt lines and other
targets' records skipped, as a build skips them), never handed to MetaSchedule as it is.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.analysis import estimate_tir_flops

from .. import names, strategy
from ..compiler import analyze, calibrated
from ..errors import TvmfuseError
from ..frontend import ImportedModel
from ..options import BuildOptions
from ..passes.apply_database import hand_written
from ..passes.apply_schedule_rules import ApplyScheduleRules
from ..remote import Remote
from ..targets import TargetSpec
from . import database, lookup
from .measure import Timer
from .search import Verdict, search_task, verify

log = logging.getLogger(__name__)

#: What one search trial is assumed to cost before one has been measured (seconds): 1.0-3.9 s
#: a candidate (compiled and timed) on ResNet-50's and BERT-base's kernels on a 2-core Zen 4
#: (``tvmfuse tune resnet50 --top-k 4 --trials 96``, the progress bar's s/trial).
FIRST_TRIAL_GUESS_S = 2.0


@dataclass
class TaskPlan:
    """One tuning task: a distinct fused kernel, how often it runs and how much work it is."""

    name: str
    launches: int
    flops: float  # per launch
    #: The database already held a searched record for it when the job started.
    tuned: bool
    #: Seconds of one launch with the best record (after seeding), when measured.
    seconds: float | None = None
    #: Trials the plan gives the search (0: seed only).
    trials: int = 0
    #: Milliseconds of the kernel's schedule and of the best searched one, re-timed alternately
    #: after the search, and whether the searched one was recorded.
    verified_ms: float | None = None
    searched_ms: float | None = None
    accepted: bool = False

    @property
    def share(self) -> float:
        return (self.seconds or 0.0) * self.launches

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


#: Tuning jobs running in this process, as (job folder, database folder): what
#: :func:`stop_jobs` saves when a signal ends the process.
_RUNNING: list[tuple[Path, Path]] = []


def stop_jobs() -> bool:
    """Merge what this process's running jobs have measured into their databases, for a signal
    handler that then ends the process at once. Unwinding instead (an exception raised inside
    MetaSchedule's C++ calls) was seen to end in std::terminate. Returns False when there is no
    job, or when one is merging already (its database's lock is held here)."""
    if not _RUNNING or any(d.resolve() in database.held() for _, d in _RUNNING):
        return False
    for staging, database_dir in list(_RUNNING):
        added = database.merge_job(staging, database_dir)
        log.warning("stopped: %d record(s) of this job merged into %s", added, database_dir)
    return True


def tune_model(model: ImportedModel, target: TargetSpec, options: BuildOptions, *, trials: int,
               trials_per_iter: int = 4, top_k: int | None = None, budget_s: float | None = None,
               retune: bool = False, only: list[str] | None = None, progress: bool = True,
               rpc: str | None = None):
    """Tune ``model``'s fused kernels (or ``only`` the named ones), as a build under ``options``
    makes them (its rules, precision and accumulator), for ``target`` into ``options.database``
    (default: the user's database of the target,
    :func:`tvmfuse.tuning.lookup.user_database`): hand-written seeds for every kernel, then a
    MetaSchedule search of ``trials`` over the ``top_k`` kernels that take the most time, within
    ``budget_s``. ``rpc`` (``HOST:PORT:KEY``) measures on a device registered with an RPC
    tracker instead of here. Returns the database folder and the task plans."""
    remote = Remote.parse(rpc) if rpc is not None else None
    if remote is None and target.why_not_runnable() is not None:
        raise TvmfuseError(f"cannot tune for {target.name} here: {target.why_not_runnable()}; "
                           f"measure on a device with --rpc HOST:PORT:KEY")
    emulated = remote is not None and remote.emulated
    database_dir = options.database or lookup.user_database(target, emulated)
    if emulated:
        own = {lookup.user_database(target).resolve(), lookup.shipped_folder(target).resolve()}
        if database_dir.resolve() in own:
            raise TvmfuseError(f"{remote.key} is an emulator: records measured there must not go "
                               f"into {target.name}'s database {database_dir}; leave --db out "
                               f"(they go to {lookup.user_database(target, True)})")
        log.warning("tuning on %s, an emulator: its times say nothing about %s's speed, and the "
                    "records go to %s, which builds never apply unless given with --db",
                    remote.key, target.name, database_dir)
    if remote is not None:
        remote.check_reachable()
    # the kernels of the build these options make (rules, precision, accumulator, fusion flags;
    # an int8 build's quantization, calibrated once here): the records are for them; the
    # analysis stops before the schedules read any database
    options = calibrated(model, target, options)
    mod, _ = analyze(model, target, options)
    tvm_target = target.tvm_target()
    with tvm_target:
        plans = tune(mod, tvm_target, database_dir, trials=trials,
                     scheduler=strategy.scheduler(target),
                     tir_pipeline=strategy.for_target(target).tir_pipeline(),
                     trials_per_iter=trials_per_iter,
                     top_k=top_k, budget_s=budget_s, retune=retune, only=only,
                     progress=progress, remote=remote, cross_cc=target.cross_cc)
    return database_dir, plans


@dataclass
class ModelTimes:
    """The model's latency built without the database (the rules' schedules: the seeds) and
    with it, in interleaved runs (:func:`tvmfuse.bench.measure.measure`)."""

    untuned_ms: float
    tuned_ms: float
    repeat: int

    @property
    def gain(self) -> float:
        return 1 - self.tuned_ms / self.untuned_ms


def compare(model: ImportedModel, target: TargetSpec, options: BuildOptions,
            database_dir: Path, repeat: int = 20) -> ModelTimes:
    """Build ``model`` for ``target`` (here) without a database and with ``database_dir``, and
    time both on its example inputs in interleaved rounds; medians."""
    import dataclasses  # noqa: PLC0415

    from ..artifact import build  # noqa: PLC0415 - the build's own modules, only to compare
    from ..bench.measure import measure  # noqa: PLC0415
    from ..compiler import compile_model  # noqa: PLC0415
    from ..runtime import load  # noqa: PLC0415

    runs = {}
    options = calibrated(model, target, options)  # both builds quantized alike (int8)
    with tempfile.TemporaryDirectory(prefix="tvmfuse-compare-") as scratch:
        for name, changes in (("untuned", {"use_database": False}),
                              ("tuned", {"database": Path(database_dir)})):
            built = compile_model(model, target, dataclasses.replace(options, **changes))
            deployed = load(build(built, Path(scratch) / name))
            runs[name] = deployed.runner(model.example_inputs)
        untuned, tuned = measure(runs, repeat=repeat)
    return ModelTimes(untuned.median_ms, tuned.median_ms, repeat)


def plan_tasks(mod, target, database_):
    """The tasks of ``mod`` (a module after FuseTIR), largest share of FLOPs first, with plans."""
    tasks = []
    for task in ms.relax_integration.extract_tasks(mod, target):
        func = task.dispatched[0]["main"]
        if func.attrs is not None and func.attrs.get(names.IS_SCHEDULED, False):
            # a kernel written scheduled (FuseAttention's): it has no blocks to search over
            log.info("%s is a hand-written kernel, not searched", task.task_name)
        else:
            tasks.append(task)
    plans = []
    for task in tasks:
        workload = task.dispatched[0]
        record = database_.query_tuning_record(workload, target, task.task_name)
        plans.append(TaskPlan(task.task_name, int(task.weight),
                              float(estimate_tir_flops(workload)), record is not None))
    order = sorted(range(len(tasks)), key=lambda i: -plans[i].launches * plans[i].flops)
    return [tasks[i] for i in order], [plans[i] for i in order]


def tune(mod, target, database_dir: Path, *, trials: int, scheduler: ApplyScheduleRules,
         tir_pipeline: str, trials_per_iter: int = 4, top_k: int | None = None,
         budget_s: float | None = None, retune: bool = False, only: list[str] | None = None,
         progress: bool = True, remote: Remote | None = None,
         cross_cc: str | None = None) -> list[TaskPlan]:
    """Seed, plan and search the kernels of ``mod`` (after FuseTIR) for ``target`` into
    ``database_dir``; see the module docstring. ``scheduler`` applies the target's schedule
    rules as the build does and ``tir_pipeline`` lowers as it does; ``only`` restricts the run
    to the named kernels; ``remote`` measures on an RPC device (kernels linked here, with
    ``cross_cc`` when the device needs it). Returns the plans."""
    database_dir = Path(database_dir)
    database_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    database.recover_jobs(database_dir)  # records of jobs that were killed: the resume starts there
    existing = _existing(database_dir, target)
    tasks, plans = plan_tasks(mod, target, existing)
    if only is not None:
        unknown = sorted(set(only) - {p.name for p in plans})
        if unknown:
            raise TvmfuseError(f"no kernel named {unknown[0]!r} to tune; kernels are: "
                               f"{', '.join(p.name for p in plans)}")
    with database.job_folder(database_dir) as staging:
        _RUNNING.append((staging, database_dir))
        try:
            job = ms.database.JSONDatabase(work_dir=str(staging))
            # seed records of searched kernels wait for the search's verified timings of the
            # same schedule: the build picks the fastest record, and timings compare only
            # when taken together
            pending: dict[str, tuple] = {}
            # one RPC session for the whole job
            with Timer(target, tir_pipeline, remote=remote, cross_cc=cross_cc) as timer:
                _seed([(t, p) for t, p in zip(tasks, plans) if only is None or p.name in only],
                      target, scheduler, existing, pending, timer)
                _plan_search(plans, trials, top_k, retune, only, trials_per_iter)
                for plan in plans:
                    if not plan.trials and plan.name in pending:
                        _commit(job, target, *pending.pop(plan.name))
                _log_plan(plans, budget_s)
                _search([(t, p) for t, p in zip(tasks, plans) if p.trials], target, scheduler,
                        staging, job, existing, pending, timer, trials_per_iter, started,
                        budget_s, progress)
        finally:
            for record in pending.values():  # searches not done: the seeds as first timed
                _commit(job, target, *record)
            _RUNNING.remove((staging, database_dir))
            _keep_candidates(staging, database_dir)
            added = database.merge_job(staging, database_dir)
            log.info("tuned for %.0f s; %d record(s) added to %s",
                     time.perf_counter() - started, added, database_dir)
    return plans


#: Where a job's searched candidates are kept, inside the database folder (never applied).
CANDIDATES = "logs"


def _keep_candidates(staging: Path, database_dir: Path) -> None:
    """Move the job's per-task candidate databases into the database's CANDIDATES folder."""
    for folder in sorted(staging.glob("candidates-*")):
        keep = database_dir / CANDIDATES / f"{staging.name.lstrip('.')}-{folder.name}"
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(folder), str(keep))


def _existing(database_dir: Path, target):
    """What ``database_dir`` holds for ``target``, as MetaSchedule reads it: a clean copy (corrupt
    lines and other targets' records left out, as a build leaves them out) in memory."""
    found = ms.database.MemoryDatabase()
    if not database.has_database(database_dir):
        return found
    with tempfile.TemporaryDirectory(prefix="tvmfuse-db-") as scratch:
        clean = database.usable(database_dir, dict(target.export()), Path(scratch))
        if clean is not None:
            for record in ms.database.JSONDatabase(work_dir=str(clean)).get_all_tuning_records():
                _copy_record(record, found)
    return found


def _seed(todo, target, scheduler: ApplyScheduleRules, existing, pending: dict,
          timer: Timer) -> None:
    """Set each ``(task, plan)``'s seconds per launch: its best existing record's, or its
    hand-written schedule's, timed (all built together) and put into ``pending`` by task name
    as the seed record; None where neither exists."""
    fresh = []
    for task, plan in todo:
        workload = task.dispatched[0]
        record = existing.query_tuning_record(workload, target, task.task_name)
        if record is not None:
            plan.tuned = not is_seed(record.trace)  # a seed alone is no search
            run_secs = [float(s) for s in record.run_secs or []]
            plan.seconds = min(run_secs) if run_secs else None
            continue
        schedule = hand_written(workload["main"], target, scheduler)
        if schedule is not None:
            fresh.append((plan, schedule, workload))
    timed = timer.time_many([schedule.mod["main"] for _, schedule, _ in fresh])
    for (plan, schedule, workload), seconds in zip(fresh, timed):
        if isinstance(seconds, Exception):
            raise seconds
        plan.seconds = seconds
        pending[plan.name] = (schedule.trace, workload, [seconds])
        log.debug("seeded %s: %.3f ms", plan.name, seconds * 1e3)


def is_seed(trace) -> bool:
    """Whether a record's trace is a hand-written seed (annotated by :func:`hand_written`)."""
    return any(inst.kind.name == "Annotate" and str(inst.attrs[0]) == names.SCHEDULE
               for inst in trace.insts)


def _plan_search(plans: list[TaskPlan], trials: int, top_k: int | None, retune: bool,
                 only: list[str] | None, trials_per_iter: int) -> None:
    """Give the search's trials to the tasks with the largest measured share of time."""
    candidates = [p for p in plans if (retune or not p.tuned) and (only is None or p.name in only)]
    candidates.sort(key=lambda p: -p.share)
    if top_k is not None:
        candidates = candidates[:top_k]
    if trials <= 0 or not candidates:
        return
    candidates = candidates[:max(1, trials // trials_per_iter)]  # one round each at least
    rounds = {p.name: 1 for p in candidates}
    spare = max(0, trials // trials_per_iter - len(candidates))
    total = sum(p.share for p in candidates) or 1.0
    for plan in candidates:  # the spare rounds in proportion to the share of time...
        rounds[plan.name] += int(spare * plan.share / total)
    leftover = spare - (sum(rounds.values()) - len(candidates))
    for plan in candidates[:leftover]:  # ...and what rounding left, to the largest shares
        rounds[plan.name] += 1
    for plan in candidates:
        plan.trials = min(trials, rounds[plan.name] * trials_per_iter)


def _log_plan(plans: list[TaskPlan], budget_s: float | None) -> None:
    total = sum(p.share for p in plans) or 1.0
    for p in sorted(plans, key=lambda p: -p.share):
        log.info("task %-58s x%-3d %6.3f ms %5.1f%% of time  %s", p.name, p.launches,
                 (p.seconds or 0) * 1e3, 100 * p.share / total,
                 f"search {p.trials} trials" if p.trials else
                 "searched before" if p.tuned else "hand-written seed")
    searched = sum(p.trials for p in plans)
    if budget_s is not None:
        log.info("plan: %d task(s), %d searched for at most %s, the time shared in proportion "
                 "to their planned trials", len(plans), sum(1 for p in plans if p.trials),
                 _minutes(budget_s))
        return
    log.info("plan: %d task(s), %d searched with %d trials; ETA about %s", len(plans),
             sum(1 for p in plans if p.trials), searched,
             _minutes(searched * FIRST_TRIAL_GUESS_S))


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _search(todo, target, scheduler: ApplyScheduleRules, staging: Path, job, existing,
            pending: dict, timer: Timer, trials_per_iter: int, started: float,
            budget_s: float | None, progress: bool) -> None:
    """Search the planned tasks one at a time within the budget (:func:`.search.search_task`),
    each task's candidates into a folder of its own inside the job's ``staging`` folder, and
    record each task's verified winner (:func:`.search.verify`)."""
    total = sum(p.trials for _, p in todo)
    if not total:
        return
    per_trial = FIRST_TRIAL_GUESS_S
    done, searching = 0, 0.0
    # under a budget the trials are what the time allows: counted, not a fraction of a total
    bar = tqdm(total=None if budget_s is not None else total, unit="trial",
               disable=not progress, desc="search")
    try:
        for index, (task, plan) in enumerate(todo):
            elapsed = time.perf_counter() - started
            if budget_s is not None and elapsed + per_trial * trials_per_iter > budget_s:
                log.warning("budget spent (%s): %s and %d other task(s) not searched",
                            _minutes(budget_s), plan.name, len(todo) - index - 1)
                break
            trials, deadline = plan.trials, None
            if budget_s is not None:
                # what is left of the budget, shared by the tasks left in proportion to their
                # planned trials (at least one round each)
                share = trials / sum(p.trials for _, p in todo[index:])
                deadline = time.perf_counter() + (budget_s - elapsed) * share
            bar.set_postfix_str(plan.name[:40])
            task_start = time.perf_counter()
            candidates = search_task(task, target, scheduler, timer,
                                     staging / f"candidates-{index:05d}", trials,
                                     trials_per_iter, on_trials=bar.update, deadline=deadline)
            baseline = _current_schedule(task, target, scheduler, existing)
            if baseline is not None and candidates:
                verdict = verify(baseline.mod["main"], candidates, timer)
                pending.pop(plan.name, None)  # re-timed: recorded with the verified timings
                _record(verdict, task, plan, target, baseline, job)
            searching += time.perf_counter() - task_start
            done += max(len(candidates), 1)
            per_trial = searching / done
    finally:
        bar.close()


def _current_schedule(task, target, scheduler: ApplyScheduleRules, existing):
    """The schedule a build gives ``task`` now: the best record's of the database (a seed's as
    its rule is now), or the hand-written one; None where there is neither."""
    workload = task.dispatched[0]
    record = existing.query_tuning_record(workload, target, task.task_name)
    if record is not None and not is_seed(record.trace):
        sch = s_tir.Schedule(workload)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        return sch
    return hand_written(workload["main"], target, scheduler)


def _record(verdict: Verdict, task, plan: TaskPlan, target, baseline, job) -> None:
    """Record the verified timings: the kernel's schedule's, and the winner's where it beat it
    (both from the same alternating rounds, so that the build's choice by time agrees)."""
    plan.verified_ms = verdict.seed_median * 1e3
    plan.searched_ms = None if verdict.best_median is None else verdict.best_median * 1e3
    plan.accepted = verdict.accepted
    _commit(job, target, baseline.trace, task.dispatched[0], verdict.seed_seconds)
    if verdict.accepted:
        _commit(job, target, verdict.best.sch.trace, task.dispatched[0], verdict.best_seconds)
    gain = 1 - verdict.best_median / verdict.seed_median if verdict.best_median else 0.0
    log.info("%s: schedule %.3f ms, best searched %.3f ms (%+.1f%%): %s", plan.name,
             verdict.seed_median * 1e3, (verdict.best_median or 0) * 1e3, 100 * gain,
             "recorded" if verdict.accepted else "not recorded (within the timings' spread)")


def _commit(job, target, trace, workload, seconds: list[float]) -> None:
    """Record ``trace`` on ``workload`` (a task's IRModule) with ``seconds`` into ``job``."""
    job.commit_tuning_record(ms.database.TuningRecord(
        trace, job.commit_workload(workload), seconds, target,
        ms.arg_info.ArgInfo.from_prim_func(workload["main"])))


def _copy_record(record, database) -> None:
    database.commit_tuning_record(ms.database.TuningRecord(
        record.trace, database.commit_workload(record.workload.mod), record.run_secs,
        record.target, record.args_info))
