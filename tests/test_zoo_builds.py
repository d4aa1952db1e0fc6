"""Full-size zoo models, built for this CPU and verified against PyTorch: every kernel has a
hand-written schedule, and the committed database holds a record for every kernel."""

import pytest

from tvmfuse import api, env, strategy, targets
from tvmfuse.verify import verify

from conftest import HOST

ZOO = ["resnet50", "mobilenet_v2", "bert-base"]
#: bert-base's build (50 s on 2 cores) runs in the slow suite; the fusion and suite tests build
#: transformers in the default run.
BUILT = ["resnet50", "mobilenet_v2", pytest.param("bert-base", marks=pytest.mark.slow)]
TARGET = api.get_target(HOST)


@pytest.mark.parametrize("name", BUILT)
def test_zoo_model_builds_with_hand_written_schedules_and_matches_pytorch(name, tmp_path):
    model = api.import_model(name)
    compiled = api.compile_model(model, TARGET, api.BuildOptions(use_database=False))
    implementations = compiled.analysis.implementations
    assert set(implementations) == set(compiled.analysis.kernels)
    assert all(i.startswith("cpu.") for i in implementations.values()), implementations
    checks = verify(api.load(api.build(compiled, tmp_path / name)), model)
    assert all(c.rel_err <= 1e-4 for c in checks)


#: The committed avx512 databases, one per CPU they were recorded on (avx512-znver4, ...).
COMMITTED = sorted(p.name.removeprefix("avx512-")
                   for p in env.SHIPPED_TUNING_LOGS.glob("avx512-*") if p.is_dir())


@pytest.mark.slow  # 20 s a database and model: the full pipeline on a full-size model
@pytest.mark.parametrize("cpu", COMMITTED)
@pytest.mark.parametrize("name", ZOO)
def test_the_committed_database_covers_every_zoo_kernel(name, cpu):
    """Each committed database has a record for every kernel of the zoo as built for the CPU it
    was recorded for (a build applies only its own CPU's folder; analysis needs no such CPU)."""
    target = targets.avx512_for(cpu)
    model = api.import_model(name)
    _, analysis = api.analyze(model, target, api.BuildOptions(), until="schedule")
    assert (analysis.database == api.default_database(target)
            == env.SHIPPED_TUNING_LOGS / target.key)
    assert analysis.untuned == []
    assert all(i.startswith((strategy.TUNED, strategy.DATABASE_SEED))
               or k in analysis.written_scheduled for k, i in analysis.implementations.items())
    if name == "bert-base":  # the fused attention: written scheduled, no record needed
        assert analysis.written_scheduled == {"attention"}


@pytest.mark.parametrize("folder", sorted(env.SHIPPED_TUNING_LOGS.glob("avx512-*")),
                         ids=lambda p: p.name)
def test_each_committed_database_holds_only_its_own_cpus_records(folder):
    from tvmfuse.tuning import database as tuning_db

    db = tuning_db.read(folder)
    cpu = folder.name.removeprefix("avx512-")
    assert db.records and db.problems == []
    assert {db.target_of(r)["mcpu"] for r in db.records} == {cpu}
