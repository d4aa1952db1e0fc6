import torch
from torch import nn

from tvmfuse import api
from tvmfuse.verify import verify
from conftest import HOST


class Scores(nn.Module):
    def forward(self, q, k, mask):
        scores = (q @ k.transpose(-1, -2)) * 0.125 + mask
        return torch.softmax(scores, dim=-1)


def test_scale_mask_softmax_is_one_kernel(tmp_path):
    torch.manual_seed(0)
    args = [torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 1, 1, 16)]
    model = api.import_torch(Scores(), args)
    _, analysis = api.analyze(model, api.get_target(HOST), api.BuildOptions())
    softmax = next(g for g in analysis.groups if "softmax" in g.ops)
    assert softmax.rule.startswith("tvmfuse.scale_mask_softmax.")
    assert softmax.ops[-1] == "softmax" and {"multiply", "add"} <= set(softmax.ops)
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    verify(api.load(api.build(compiled, tmp_path / "out")), model)


def test_softmax_without_scale_and_mask_is_no_match():
    model = api.import_torch(nn.Softmax(dim=-1), [torch.randn(2, 16)])
    _, analysis = api.analyze(model, api.get_target(HOST), api.BuildOptions())
    assert not any(g.rule.startswith("tvmfuse.scale_mask_softmax") for g in analysis.groups)
