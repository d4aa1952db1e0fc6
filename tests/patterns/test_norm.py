import torch
from torch import nn

from tvmfuse import api
from tvmfuse.verify import verify


class AddNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)

    def forward(self, x, residual):
        return self.norm(x + residual) * 2.0


def test_residual_add_and_layer_norm_are_one_kernel(tmp_path):
    torch.manual_seed(0)
    model = api.import_torch(AddNorm(), [torch.randn(2, 8, 32), torch.randn(2, 8, 32)])
    _, analysis = api.analyze(model, api.get_target("avx512"), api.BuildOptions())
    norm_group = next(g for g in analysis.groups if "layer_norm" in g.ops)
    assert norm_group.rule == "tvmfuse.add_layer_norm.affine"
    assert norm_group.ops == ("add", "layer_norm")
    compiled = api.compile_model(model, api.get_target("avx512"), api.BuildOptions())
    verify(api.load(api.build(compiled, tmp_path / "out")), model)


def test_layer_norm_without_a_residual_is_no_match():
    model = api.import_torch(nn.LayerNorm(32), [torch.randn(2, 32)])
    _, analysis = api.analyze(model, api.get_target("avx512"), api.BuildOptions())
    assert not analysis.groups and analysis.kernels == ["layer_norm"]
