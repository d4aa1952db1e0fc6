import numpy as np
import pytest
import torch
from torch import nn

from tvmfuse import api
from tvmfuse.passes.winograd_conv2d import transform_weight
from tvmfuse.verify import verify


def test_transformed_weights_give_the_direct_conv_on_one_tile():
    """The F(2x2, 3x3) algebra itself, against a direct 3x3 conv of one 4x4 tile."""
    rng = np.random.default_rng(0)
    d = rng.standard_normal((4, 4))
    w = rng.standard_normal((3, 3, 1, 1))
    bt = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]])
    at = np.array([[1, 1, 1, 0], [0, 1, -1, -1]])
    u = transform_weight(w).reshape(4, 4)
    y = at @ (u * (bt @ d @ bt.T)) @ at.T
    direct = np.array([[np.sum(d[i:i + 3, j:j + 3] * w[:, :, 0, 0]) for j in range(2)]
                       for i in range(2)])
    np.testing.assert_allclose(y, direct, rtol=1e-10)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
        self.down = nn.Conv2d(32, 32, 3, stride=2, padding=1)  # strided: stays direct

    def forward(self, x):
        return self.down(torch.relu(self.conv2(torch.relu(self.conv1(x)))))


@pytest.mark.parametrize("size", [12, 7])  # even, and odd (the last tiles cropped)
def test_the_rule_rewrites_stride_one_3x3_convs_and_matches_pytorch(size, tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text("[avx512]\nwinograd_conv2d = { enabled = true }\n")
    torch.manual_seed(0)
    model = api.import_torch(Block().eval(), [torch.randn(1, 16, size, size)])
    options = api.BuildOptions(fusion_rules=rules, use_database=False)
    mod, _ = api.analyze(model, api.get_target("avx512"), options, until="fold")
    script = mod.script(show_meta=False)
    assert script.count("R.nn.conv2d(") == 1  # only the strided conv is left
    assert script.count("R.matmul(") == 2 * 3  # input, product and output GEMMs per conv
    compiled = api.compile_model(model, api.get_target("avx512"), options)
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-5
