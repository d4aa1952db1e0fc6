"""Full-size zoo models, built for this CPU and verified against PyTorch (slow: minutes each)."""

import pytest

from tvmfuse import api
from tvmfuse.verify import verify

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "bert-base"])
def test_zoo_model_builds_and_matches_pytorch(name, tmp_path):
    model = api.import_model(name)
    compiled = api.compile_model(model, api.get_target("avx512"), api.BuildOptions(use_database=False))
    checks = verify(api.load(api.build(compiled, tmp_path / name)), model)
    assert all(c.rel_err <= 1e-4 for c in checks)
