"""Full-size zoo models, built for this CPU and verified against PyTorch: every kernel has a
hand-written schedule, and the committed database holds a record for every kernel."""

import pytest

from tvmfuse import api, strategy
from tvmfuse.verify import verify

ZOO = ["resnet50", "mobilenet_v2", "bert-base"]
TARGET = api.get_target("avx512")


@pytest.mark.parametrize("name", ZOO)
def test_zoo_model_builds_with_hand_written_schedules_and_matches_pytorch(name, tmp_path):
    model = api.import_model(name)
    compiled = api.compile_model(model, TARGET, api.BuildOptions(use_database=False))
    implementations = compiled.analysis.implementations
    assert set(implementations) == set(compiled.analysis.kernels)
    assert all(i.startswith("cpu.") for i in implementations.values()), implementations
    checks = verify(api.load(api.build(compiled, tmp_path / name)), model)
    assert all(c.rel_err <= 1e-4 for c in checks)


@pytest.mark.parametrize("name", ZOO)
def test_the_committed_database_covers_every_zoo_kernel(name):
    model = api.import_model(name)
    _, analysis = api.analyze(model, TARGET, api.BuildOptions(), until="schedule")
    assert analysis.database == api.default_database(TARGET)
    assert analysis.untuned == []
    assert all(i == strategy.TUNED or i.startswith(strategy.DATABASE_SEED)
               for i in analysis.implementations.values())
