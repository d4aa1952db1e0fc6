"""Tune a model's fused kernels into a JSON database: hand-written seeds first, then MetaSchedule
(XGBoost cost model) searches over the kernels that take the most time.

Tasks are the PrimFuncs the tvmfuse pipeline produces (after FuseTIR), deduplicated by structure,
so every launch of the same kernel shape is tuned once, across models too (a workload already in
the database is not measured again).

1. **Seed.** Every task without a record gets the hand-written schedule the build would give it
   (:mod:`tvmfuse.schedules`), measured here and committed as a record whose trace carries the
   rule's name. The database then covers every kernel, and a search result is applied only where
   it measured faster than the hand-written schedule.
2. **Plan.** Tasks are ordered by their measured share of the model's time (seed time x launches);
   the ``top_k`` largest are searched, the trials split between them, within ``budget_s`` of wall
   clock when given. The plan is logged first, with an ETA from the measured cost of a trial.
3. **Search**, one task at a time (MetaSchedule's task scheduler commits nothing until it has been
   round every task once: 15 minutes without a record on ResNet-50 here), with a progress bar.

Each job writes every record it measures at once into a private folder (seeds, and one database
per searched task), merged into the database under its lock when the job ends, Ctrl-C and
SIGTERM included. A job killed outright (``kill -9``, power lost) leaves its folder, locked only
while the job lives: the next job on that database, or ``tvmfuse db check``/``recover``, merges
it and says so. Either way finished records are kept and a re-run resumes.

The database is read through :func:`tvmfuse.tuning.database.usable` (corrupt lines and other
targets' records skipped, as a build skips them), never handed to MetaSchedule as it is.

Measured here: MetaSchedule's default build function imports ``tvm.s_tir.tensor_intrin`` (every
target's intrinsics, CUDA's first: 45-60 s on this 2-core machine) in each builder worker, where
nothing needs it (the modules it builds are scheduled, their intrinsics already inlined), and
times out. The builder below builds without that import (:func:`_build`) and allows 120 s: a
4-trial tuning of tiny-resnet took 155 s before, most of it two such imports.
"""

from __future__ import annotations

import gc
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tvm
from tqdm import tqdm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.analysis import estimate_tir_flops
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

from .. import names, strategy
from ..compiler import analyze
from ..errors import TvmfuseError
from ..frontend import ImportedModel
from ..options import BuildOptions
from ..passes.apply_database import hand_written
from ..passes.apply_schedule_rules import ApplyScheduleRules
from ..profile import param_specs, random_args
from ..remote import Remote, SharedLibraryExport
from ..strategy.cpu import CPU_PIPELINE
from ..targets import TargetSpec
from . import database, intrinsics, lookup

log = logging.getLogger(__name__)

#: MetaSchedule's per-task messages (design spaces, candidates), under MetaSchedule's logger so
#: that its level governs them (`tvmfuse tune` shows them with -v).
_SEARCH_LOG = logging.getLogger("tvm.s_tir.meta_schedule.search")
#: What one search trial is assumed to cost before one has been measured (seconds).
FIRST_TRIAL_GUESS_S = 20.0


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

    @property
    def share(self) -> float:
        return (self.seconds or 0.0) * self.launches

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _build(mod, target, _params):
    """Builder-worker build: MetaSchedule's default (``default_build``) without its import of
    the tensor-intrinsic registry, which only applying a tensorization needs (the search, in
    this process, does that)."""
    from tvm.driver import build  # noqa: PLC0415 - in the worker
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock  # noqa: PLC0415

    return build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


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
    # the kernels of the build these options make (rules, precision, accumulator, fusion flags):
    # the records are for them; the analysis stops before the schedules read any database
    mod, _ = analyze(model, target, options)
    tvm_target = target.tvm_target()
    with tvm_target:
        plans = tune(mod, tvm_target, database_dir, trials=trials,
                     scheduler=strategy.scheduler(target), trials_per_iter=trials_per_iter,
                     top_k=top_k, budget_s=budget_s, retune=retune, only=only,
                     progress=progress, remote=remote, cross_cc=target.cross_cc)
    return database_dir, plans


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
         trials_per_iter: int = 4, top_k: int | None = None, budget_s: float | None = None,
         retune: bool = False,
         only: list[str] | None = None, progress: bool = True, remote: Remote | None = None,
         cross_cc: str | None = None) -> list[TaskPlan]:
    """Seed, plan and search the kernels of ``mod`` (after FuseTIR) for ``target`` into
    ``database_dir``; see the module docstring. ``scheduler`` applies the target's schedule
    rules as the build does; ``only`` restricts the run to the named kernels; ``remote`` measures
    on an RPC device (candidates linked here, with ``cross_cc`` when the device needs it).
    Returns the plans."""
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
            with Measure(remote, cross_cc) as measure:  # one RPC session for every seed
                for task, plan in zip(tasks, plans):
                    if only is None or plan.name in only:
                        plan.seconds = _seed(task, plan, target, scheduler, existing, job,
                                             measure)
            _plan_search(plans, trials, top_k, retune, only, trials_per_iter)
            _log_plan(plans, budget_s)
            _search([(t, p) for t, p in zip(tasks, plans) if p.trials], target, staging, job,
                    trials_per_iter, started, budget_s, progress, _runner(remote, cross_cc))
        finally:
            _RUNNING.remove((staging, database_dir))
            added = database.merge_job(staging, database_dir)
            log.info("tuned for %.0f s; %d record(s) added to %s",
                     time.perf_counter() - started, added, database_dir)
    return plans


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


def _seed(task, plan: TaskPlan, target, scheduler: ApplyScheduleRules, existing, job,
          measure: Measure) -> float | None:
    """Measure the task's best existing record, or seed it with the hand-written schedule.
    Returns seconds per launch (None when neither exists or it cannot run here)."""
    workload = task.dispatched[0]
    record = existing.query_tuning_record(workload, target, task.task_name)
    if record is not None:
        plan.tuned = not is_seed(record.trace)  # a seed alone is no search
        run_secs = [float(s) for s in record.run_secs or []]
        return min(run_secs) if run_secs else None
    schedule = hand_written(workload["main"], target, scheduler)
    if schedule is None:
        return None
    seconds = measure(schedule.mod["main"], target)
    job.commit_tuning_record(ms.database.TuningRecord(
        schedule.trace, job.commit_workload(workload), [seconds], target,
        ms.arg_info.ArgInfo.from_prim_func(workload["main"])))
    log.debug("seeded %s: %.3f ms", plan.name, seconds * 1e3)
    return seconds


def is_seed(trace) -> bool:
    """Whether a record's trace is a hand-written seed (annotated by :func:`hand_written`)."""
    return any(inst.kind.name == "Annotate" and str(inst.attrs[0]) == names.SCHEDULE
               for inst in trace.insts)


class Measure:
    """Seconds per call of a PrimFunc, as MetaSchedule's runner measures it: here, or on an RPC
    device (one session for the whole job)."""

    def __init__(self, remote: Remote | None = None, cross_cc: str | None = None):
        self.remote, self.cross_cc, self._session = remote, cross_cc, None

    def __enter__(self) -> Measure:
        return self

    def __exit__(self, *exc) -> None:
        """End the RPC session: the tracker lends a device to one session at a time, and the
        search's runner asks for it next (left open, the runner waited for its timeout: 120 s,
        then 600 s on the emulator, before its first candidate ran)."""
        self._session = None
        gc.collect()

    def __call__(self, func, target) -> float:
        # as MetaSchedule's builder does: weights arrive packed (the build packs them once), so
        # the packing block is not timed; TVM's pass takes only a plain copy as the packing, not
        # a zero-padded one (a weight padded to whole register tiles): that kernel is timed
        # with its packing, which overstates its seed's time
        mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        try:
            mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
        except tvm.error.InternalError:
            log.debug("timing %s with its weight packing (a padded weight)", func)
        func = mod["main"]
        kind = "cuda" if target.kind.name == "cuda" else "cpu"
        # a CPU seed lowered as a build lowers it (its last column tile apart: PART_TAIL)
        library = tvm.compile(mod, target=target,
                              tir_pipeline="default" if kind == "cuda" else CPU_PIPELINE)
        if self.remote is None:
            module, device = library.mod, tvm.device(kind, 0)
        else:
            if self._session is None:
                self._session = self.remote.session()
            path = SharedLibraryExport(self.cross_cc)(library.mod)
            self._session.upload(path)
            module = self._session.load_module(os.path.basename(path))
            device = self._session.device(kind, 0)
        args = random_args(param_specs(func), device)
        timer = module.time_evaluator("main", device, number=1, repeat=3, min_repeat_ms=100)
        return float(min(timer(*args).results))


def _runner(remote: Remote | None, cross_cc: str | None):
    if remote is None:
        return ms.runner.LocalRunner(timeout_sec=60), None
    return ms.runner.RPCRunner(remote.runner_config()), SharedLibraryExport(cross_cc)


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
    eta = searched * FIRST_TRIAL_GUESS_S
    log.info("plan: %d task(s), %d searched with %d trials; ETA about %s%s", len(plans),
             sum(1 for p in plans if p.trials), searched, _minutes(eta),
             "" if budget_s is None else f" (budget {_minutes(budget_s)})")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _search(todo, target, staging: Path, job, trials_per_iter: int, started: float,
            budget_s: float | None, progress: bool, runner_and_export) -> None:
    """MetaSchedule's evolutionary search, one task at a time, within the budget; each task's
    search writes into a folder of its own inside the job's ``staging`` folder."""
    total = sum(p.trials for _, p in todo)
    if not total:
        return
    per_trial = FIRST_TRIAL_GUESS_S
    done, searching = 0, 0.0
    bar = tqdm(total=total, unit="trial", disable=not progress, desc="search")
    try:
        for task, plan in todo:
            elapsed = time.perf_counter() - started
            if budget_s is not None and elapsed + per_trial * trials_per_iter > budget_s:
                log.warning("budget spent (%s): %s and %d other task(s) not searched",
                            _minutes(budget_s), plan.name,
                            len(todo) - [p for _, p in todo].index(plan) - 1)
                break
            trials = plan.trials
            if budget_s is not None:  # what is left of the budget, in whole rounds
                affordable = int((budget_s - elapsed) / per_trial) // trials_per_iter
                trials = max(trials_per_iter, min(trials, affordable * trials_per_iter))
            bar.set_postfix_str(plan.name[:40])
            task_start = time.perf_counter()
            search_task(task, staging / f"search-{done:05d}", job, trials, trials_per_iter,
                        runner_and_export)
            searching += time.perf_counter() - task_start
            done += trials
            per_trial = searching / done
            bar.update(trials)
            best = job.query_tuning_record(task.dispatched[0], target, task.task_name)
            if best is not None and plan.seconds:
                log.info("%s: best %.3f ms (hand-written %.3f ms)", plan.name,
                         min(float(s) for s in best.run_secs) * 1e3, plan.seconds * 1e3)
    finally:
        bar.close()


def search_task(task, work_dir: Path, database, trials: int, trials_per_iter: int = 4,
                runner_and_export=None) -> None:
    """MetaSchedule's evolutionary search (XGBoost cost model) of one task: ``trials``
    candidates, built with the builder this machine needs (module docstring), measured by the
    runner of :func:`_runner` (here by default), committed to ``database``.

    The search commits every measured candidate at once to a JSON database in ``work_dir``
    (its own folder: a killed job's records are found there), copied to ``database`` when it
    ends.

    The search's population starts from the searched records ``database`` already holds for the
    task, not from the hand-written seeds: a seed's trace has no sampled decisions for the search
    to mutate, and replaying it under MetaSchedule's RewriteLayout postprocessor fails (the seed
    has packed its weights already, and RewriteLayout would pack the packed buffer again). Seeds
    and searched records meet in ``database``, where the build takes the fastest."""
    runner, export = runner_and_export or _runner(None, None)
    workload = database.commit_workload(task.dispatched[0])
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    search = ms.database.JSONDatabase(work_dir=str(work_dir))
    for record in database.get_top_k(workload, 64):
        if not is_seed(record.trace):
            _copy_record(record, search)
    try:
        ms.tune_tasks(
            tasks=[_tune_context(task, trials)], task_weights=[1.0], work_dir=str(work_dir),
            max_trials_global=trials, num_trials_per_iter=trials_per_iter,
            builder=ms.builder.LocalBuilder(max_workers=1, timeout_sec=120,
                                            f_build=_build, f_export=export),
            runner=runner, database=search, cost_model="xgb",
        )
    finally:  # Ctrl-C included: what was measured is kept
        known = {str(r.trace) for r in database.get_top_k(workload, 1 << 16)}
        for record in search.get_all_tuning_records():
            if str(record.trace) not in known:
                _copy_record(record, database)


def _copy_record(record, database) -> None:
    database.commit_tuning_record(ms.database.TuningRecord(
        record.trace, database.commit_workload(record.workload.mod), record.run_secs,
        record.target, record.args_info))


#: Candidates the evolutionary search keeps per trial it will measure (see _tune_context).
POPULATION_PER_TRIAL = 8


def _tune_context(task, trials: int):
    """MetaSchedule's search context for one task, logging to tvmfuse's logger.

    The evolutionary search's population is scaled to the trials it picks (``POPULATION_PER_TRIAL``
    candidates per trial, MetaSchedule's 512 at most): a 4-trial tuning of tiny-resnet took
    22-23 s with 64, 62-66 s with 512 (it evolves and scores the population four times).

    Not ``relax_integration.extracted_tasks_to_tune_contexts``: it reconfigures Python logging
    globally (``dictConfig``) from the handlers it finds on MetaSchedule's logger, and fails on
    one without a name (seen in a test process after an RPC tuning run)."""
    intrinsics.register_for(task.target)  # before TuneContext imports every target's
    population = min(512, max(64, POPULATION_PER_TRIAL * trials))
    search = ms.search_strategy.EvolutionarySearch(
        population_size=population, init_min_unmeasured=min(50, population // 2))
    return ms.TuneContext(mod=task.dispatched[0], target=task.target,
                          space_generator="post-order-apply", search_strategy=search,
                          task_name=task.task_name, logger=_SEARCH_LOG, num_threads="physical"
                          ).clone()
