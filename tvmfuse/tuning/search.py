"""Search one kernel's design space: MetaSchedule's evolutionary search and XGBoost cost model
over the space of the rule that schedules it, every candidate timed as the build runs it.

**The space.** A tvmfuse schedule rule with a design space (:meth:`CpuRule.space`) gives one
schedule per structural choice (a register tile, the threads' loop order), each with sampled
decisions (how the reduction is split and unrolled) whose defaults are the untuned schedule's;
MetaSchedule's ``ScheduleFn`` makes them the search's design spaces. Every schedule's root block
carries ``tvmfuse.space = <rule>@<version>``, which a build checks before it applies a record
(:class:`tvmfuse.passes.ApplyDatabase`). A kernel no rule has a space for gets MetaSchedule's
generic space (``post-order-apply``) instead.

**The loop** is MetaSchedule's task loop for one task (generate candidates, time them, tell the
strategy and the cost model) with :class:`~tvmfuse.tuning.measure.Timer` in place of its builder
and runner, so a candidate's time compares with its seed's. Every candidate is written at once
to a JSON database of its own (``work_dir``): a record is never lost, but none of them is
applied until :func:`verify` has re-timed the best against the kernel's current schedule.

**Verification.** The best candidates and the seed are timed again, alternately
(:func:`~tvmfuse.tuning.measure.alternate`); a candidate replaces the seed only where its median
beats the seed's by more than the spread of both (:func:`~tvmfuse.tuning.measure.beats`).
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from tvm import s_tir
from tvm.s_tir import meta_schedule as ms

from .. import names
from ..passes.apply_schedule_rules import ApplyScheduleRules
from . import intrinsics
from .measure import Timer, alternate, beats

log = logging.getLogger(__name__)

#: MetaSchedule's per-task messages (design spaces, candidates), under MetaSchedule's logger so
#: that its level governs them (`tvmfuse tune` shows them with -v).
_SEARCH_LOG = logging.getLogger("tvm.s_tir.meta_schedule.search")

#: Candidates the evolutionary search keeps per trial it will measure: a 4-trial tuning of
#: tiny-resnet took 22-23 s with a population of 64, 62-66 s with 512 (it evolves and scores the
#: population four times), for the same best record.
POPULATION_PER_TRIAL = 8
#: How often the search mutates a sampled decision of a candidate (MetaSchedule's default for a
#: CPU); the rest of the new population are copies of the fittest.
MUTATE_TILE_SIZE = 0.9
#: The searched candidates re-timed against the seed (the fastest of the search), and the
#: rounds of alternate timing each gets: five rounds give a median and a spread that one slow
#: round does not move.
VERIFY_CANDIDATES, VERIFY_ROUNDS = 3, 5


def design_space(func, target, scheduler: ApplyScheduleRules) -> list[s_tir.Schedule] | None:
    """The design space of the rule that schedules ``func`` (the untuned choice first), its
    schedules' root blocks annotated with the rule's space and version; None where that rule has
    no space."""
    found = scheduler.schedule(func, target)
    if found is None:
        return None
    rule = scheduler.rule(found[0])
    space = rule.space(func, target) if hasattr(rule, "space") else []
    for sch in space:
        sch.annotate(sch.get_sblock("root"), names.SPACE, names.space_of(rule.name, rule.version))
    return space or None


@dataclass
class Candidate:
    """A searched schedule and the seconds it measured."""

    sch: s_tir.Schedule
    seconds: float
    args_info: list = field(default_factory=list)
    #: Seconds from the start of the search to this candidate's timing.
    found_after_s: float = 0.0


def search_task(task, target, scheduler: ApplyScheduleRules, timer: Timer, work_dir: Path,
                trials: int, trials_per_iter: int = 4, on_trials=None,
                generic: bool = False, deadline: float | None = None) -> list[Candidate]:
    """Search ``task`` (an extracted task) for ``trials`` candidates, each timed by ``timer``
    and committed at once to a JSON database in ``work_dir``; the candidates that ran, fastest
    first. ``on_trials(count)`` is called after each batch (a progress bar); ``generic``
    searches MetaSchedule's generic space even where the rule has one (for comparisons);
    ``deadline`` (``time.perf_counter()``) stops the search after the round that passes it."""
    workload = task.dispatched[0]
    space = None if generic else design_space(workload["main"], target, scheduler)
    context = _tune_context(task, trials, space)
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    database = ms.database.JSONDatabase(work_dir=str(work_dir))
    committed = database.commit_workload(workload)
    model = ms.cost_model.XGBModel(num_warmup_samples=0, adaptive_training=True)
    strategy = context.search_strategy
    strategy.pre_tuning(trials, trials_per_iter, context.generate_design_space(), database,
                        model)
    ran: list[Candidate] = []
    started = time.perf_counter()
    try:
        while (candidates := strategy.generate_measure_candidates()) is not None:
            results = [_result(r) for r in timer.time_many([c.sch.mod["main"]
                                                            for c in candidates])]
            strategy.notify_runner_results(candidates, results)
            model.update(context, candidates, results)
            for candidate, result in zip(candidates, results):
                seconds = [float(s) for s in result.run_secs] if result.run_secs else [1e10]
                database.commit_tuning_record(ms.database.TuningRecord(
                    candidate.sch.trace, committed, seconds, target, candidate.args_info))
                if result.run_secs:
                    ran.append(Candidate(candidate.sch, seconds[0], candidate.args_info,
                                         time.perf_counter() - started))
            if on_trials is not None:
                on_trials(len(candidates))
            if deadline is not None and time.perf_counter() > deadline:
                break
    finally:
        strategy.post_tuning()
    return sorted(ran, key=lambda c: c.seconds)  # stable: in order of timing among equals


def _result(timed: float | Exception) -> ms.runner.RunnerResult:
    if not isinstance(timed, Exception):
        return ms.runner.RunnerResult(run_secs=[timed], error_msg=None)
    # a candidate that fails to build or run is a failed trial
    message = str(timed).strip().splitlines()[-1][:200] if str(timed).strip() else repr(timed)
    log.debug("candidate failed: %s", message)
    return ms.runner.RunnerResult(run_secs=None, error_msg=message)


@dataclass
class Verdict:
    """What re-timing the best candidates against the seed found: both medians (seconds), the
    winner (None: the seed stays) and the timings of the seed and of the winner."""

    seed_seconds: list[float]
    best: Candidate | None
    best_seconds: list[float]
    accepted: bool

    @property
    def seed_median(self) -> float:
        return statistics.median(self.seed_seconds)

    @property
    def best_median(self) -> float | None:
        return statistics.median(self.best_seconds) if self.best_seconds else None


def verify(seed_func, candidates: list[Candidate], timer: Timer,
           count: int = VERIFY_CANDIDATES, rounds: int = VERIFY_ROUNDS) -> Verdict:
    """Time ``seed_func`` (the kernel's schedule now) and the ``count`` fastest distinct
    ``candidates`` alternately for ``rounds`` rounds; the fastest candidate by median wins where
    it :func:`~tvmfuse.tuning.measure.beats` the seed."""
    distinct, seen = [], set()
    for candidate in candidates:
        text = str(candidate.sch.trace)
        if text not in seen:
            seen.add(text)
            distinct.append(candidate)
        if len(distinct) == count:
            break
    seconds = alternate(timer.load([seed_func, *(c.sch.mod["main"] for c in distinct)]),
                        rounds)
    if not distinct:
        return Verdict(seconds[0], None, [], False)
    best = min(range(len(distinct)), key=lambda i: statistics.median(seconds[i + 1]))
    return Verdict(seconds[0], distinct[best], seconds[best + 1],
                   beats(seconds[best + 1], seconds[0]))


def _tune_context(task, trials: int, space: list[s_tir.Schedule] | None):
    """MetaSchedule's search context for one task over ``space`` (None: the generic space),
    logging to tvmfuse's logger; the population scaled to the trials (POPULATION_PER_TRIAL).

    Not ``relax_integration.extracted_tasks_to_tune_contexts``: it reconfigures Python logging
    globally (``dictConfig``) from the handlers it finds on MetaSchedule's logger, and fails on
    one without a name (seen in a test process after an RPC tuning run)."""
    intrinsics.register_for(task.target)  # before TuneContext imports every target's
    population = min(512, max(64, POPULATION_PER_TRIAL * trials))
    search = ms.search_strategy.EvolutionarySearch(
        population_size=population, init_min_unmeasured=min(50, population // 2))
    if space is None:
        generator = "post-order-apply"
    else:
        # the rule's schedules as they are: no MetaSchedule rules or postprocessors over them
        # (their packing is annotated for the build's PrepackWeights, not for RewriteLayout)
        generator = ms.space_generator.ScheduleFn(
            lambda _sch: [s.copy() for s in space], sch_rules=[], postprocs=[],
            mutator_probs={ms.mutator.MutateTileSize(): MUTATE_TILE_SIZE})
    return ms.TuneContext(mod=task.dispatched[0], target=task.target, space_generator=generator,
                          search_strategy=search, task_name=task.task_name, logger=_SEARCH_LOG,
                          num_threads="physical").clone()
