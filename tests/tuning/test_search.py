"""The search of a rule's design space, for real and small: a GEMM whose rule is made to default
to a deliberately poor register tile (one row of one vector), searched for a few trials; the
search must find and record a faster tile, and the build must apply it and compute what PyTorch
computes. Also: the space's first point is the untuned schedule, and a record of an older
version of a rule is not applied."""

import logging

import pytest
import torch
from tvm.s_tir import meta_schedule as ms

from tvmfuse import api, names, strategy
from tvmfuse.schedules.cpu import Dense, _blocked
from tvmfuse.tuning import database as tuning_db
from tvmfuse.tuning.measure import Timer, as_built, beats
from tvmfuse.tuning.search import design_space
from tvmfuse.verify import verify

from conftest import HOST

TARGET = api.get_target(HOST)


class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 256)

    def forward(self, x):
        return torch.relu(self.fc(x))


def _model():
    torch.manual_seed(0)
    return api.import_torch(_Linear().eval(), [torch.randn(1, 64, 256)], name="linear256")


def _gemm(model, options):
    """The GEMM kernel's task of ``model``'s build under ``options``."""
    _, analysis = api.analyze(model, TARGET, options, until="schedule")
    gemm = next(k for k, v in analysis.implementations.items() if v.endswith("cpu.dense"))
    mod, _ = api.analyze(model, TARGET, options)  # the kernels before the schedules
    with TARGET.tvm_target() as target:
        tasks = ms.relax_integration.extract_tasks(mod, target)
    return next(t for t in tasks if t.task_name == gemm)


@pytest.fixture
def poor_default(monkeypatch):
    """GEMMs default to one-row, one-vector tiles (the space still holds the good ones)."""
    default = _blocked.default_choice

    def one_by_one(geo, tall=False):
        found = default(geo, tall)
        if found is None or not tall:
            return found
        choice, _ = found
        poor = _blocked.Tile(1, 1, choice.tile.lanes)
        return _blocked.Choice(poor), poor

    monkeypatch.setattr(_blocked, "default_choice", one_by_one)


def test_the_space_starts_with_the_untuned_schedule_and_holds_other_tiles():
    model = _model()
    task = _gemm(model, api.BuildOptions(use_database=False))
    func = task.dispatched[0]["main"]
    with TARGET.tvm_target() as target:
        space = design_space(func, target, strategy.scheduler(TARGET))
        built = strategy.scheduler(TARGET).schedule(func, target)[1]
    assert len(space) > 1
    assert all(s.get(s.get_sblock("root")).annotations[names.SPACE] ==
               f"{Dense.name}@{Dense.version}" for s in space)
    # the first point's default decisions leave the untuned schedule's loops: the same tile
    splits = [[[str(f) for f in d] for i, d in s.trace.decisions.items()
               if i.kind.name == "SamplePerfectTile"] for s in space]
    assert all(split for split in splits)  # each point samples its reduction's unrolling

    def tile(sch):
        """The columns' split ([tiles, blocks, lanes]) and the rows' ([tiles, rows])."""
        splits = [[str(f) for f in inst.inputs[1:]] for inst in sch.trace.insts
                  if inst.kind.name == "Split"]
        first = next(i for i, split in enumerate(splits) if len(split) == 3)
        return splits[first], splits[first + 1]

    assert tile(space[0]) == tile(built)
    assert len({str(tile(s)) for s in space}) == len(space)  # a tile per point
    # every point is timed as a build runs it: its packing moved out of the kernel
    assert not any(names.PREPACK in str(b) or names.LAYOUT_REWRITE_PREPROC in str(b)
                   for b in [as_built(s.mod["main"]).script() for s in space])


def test_a_search_finds_a_faster_tile_than_a_poor_default_and_the_build_applies_it(
        poor_default, tmp_path, caplog):
    model = _model()
    database = tmp_path / TARGET.key
    caplog.set_level(logging.INFO, logger="tvmfuse")
    _, plans = api.tune(model, TARGET, api.BuildOptions(database=database), trials=8, top_k=1,
                        progress=False)
    searched = [p for p in plans if p.trials]
    assert len(searched) == 1 and searched[0].accepted, searched
    plan = searched[0]
    assert plan.searched_ms < plan.verified_ms
    assert f"{plan.name}: schedule" in caplog.text and "recorded" in caplog.text
    # the build takes the searched record (the rule's default is still the poor tile)
    compiled = api.compile_model(model, TARGET, api.BuildOptions(database=database))
    assert compiled.analysis.implementations[plan.name] == f"tuned:{Dense.name}@{Dense.version}"
    verify(api.load(api.build(compiled, tmp_path / "out")), model)
    # the candidates the search timed are kept beside the database, never applied
    assert list((database / "logs").glob("*/database_tuning_record.json"))
    origins = tuning_db.stats(tuning_db.read(database))["origins"]
    assert origins[f"space:{Dense.name}@{Dense.version}"] == 1 and origins["seed:cpu.dense"] == 1


def test_a_record_of_an_older_rule_version_is_not_applied(tmp_path, monkeypatch, caplog):
    """A searched record whose rule has a new version since: the build schedules the kernel
    with the rule as it is now, says so, and still computes what PyTorch computes."""
    model = _model()
    task = _gemm(model, api.BuildOptions(use_database=False))
    database = tmp_path / "db"
    database.mkdir()
    db = ms.database.JSONDatabase(work_dir=str(database))
    with TARGET.tvm_target() as target:
        space = design_space(task.dispatched[0]["main"], target, strategy.scheduler(TARGET))
        seconds = Timer(target, strategy.for_target(TARGET).tir_pipeline())(space[1].mod["main"])
    workload = db.commit_workload(task.dispatched[0])
    db.commit_tuning_record(ms.database.TuningRecord(
        space[1].trace, workload, [seconds], TARGET.tvm_target(),
        ms.arg_info.ArgInfo.from_prim_func(task.dispatched[0]["main"])))
    applied = api.compile_model(model, TARGET, api.BuildOptions(database=database))
    assert applied.analysis.implementations[task.task_name].startswith("tuned:cpu.dense@")
    verify(api.load(api.build(applied, tmp_path / "applied")), model)

    monkeypatch.setattr(Dense, "version", Dense.version + 1)
    caplog.set_level(logging.WARNING)
    stale = api.compile_model(model, TARGET, api.BuildOptions(database=database))
    assert f"its tuning record is from cpu.dense@{Dense.version - 1}" in caplog.text
    assert not stale.analysis.implementations[task.task_name].startswith("tuned")
    verify(api.load(api.build(stale, tmp_path / "stale")), model)


def test_a_record_replaces_its_seed_only_by_more_than_the_spread_and_one_slow_round_is_noise():
    seed = [1.00, 1.02, 0.99, 1.01, 1.00]
    assert beats([0.90, 0.91, 0.89, 0.90, 1.60], seed)  # another job hit one round
    assert not beats([0.99, 1.00, 0.98, 1.00, 0.99], seed)  # within the spread
    assert not beats([0.90, 1.10, 0.85, 1.05, 0.95], seed)  # the candidate's own spread is wider
    # Two rounds of the seed hit: its spread is wider than the gain, but no timing overlaps.
    assert beats([0.053, 0.052, 0.054, 0.053, 0.060], [0.30, 0.52, 0.53, 2.0, 5.0])
    assert not beats([0.35, 0.052, 0.054, 0.053, 0.31], [0.30, 0.52, 0.53, 2.0, 5.0])
