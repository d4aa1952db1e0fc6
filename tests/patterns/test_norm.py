import torch
from torch import nn

from tvmfuse import api
from tvmfuse.verify import verify

from conftest import HOST


class AddNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)

    def forward(self, x, residual):
        return self.norm(x + residual) * 2.0


def test_residual_add_and_layer_norm_are_one_kernel(tmp_path):
    torch.manual_seed(0)
    model = api.import_torch(AddNorm(), [torch.randn(2, 8, 32), torch.randn(2, 8, 32)])
    _, analysis = api.analyze(model, api.get_target(HOST), api.BuildOptions())
    norm_group = next(g for g in analysis.groups if "layer_norm" in g.ops)
    assert norm_group.rule == "tvmfuse.add_layer_norm.affine"
    assert norm_group.ops == ("add", "layer_norm")
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    verify(api.load(api.build(compiled, tmp_path / "out")), model)


def test_layer_norm_without_a_residual_is_no_match():
    model = api.import_torch(nn.LayerNorm(32), [torch.randn(2, 32)])
    _, analysis = api.analyze(model, api.get_target(HOST), api.BuildOptions())
    assert not analysis.groups and analysis.kernels == ["layer_norm"]


class LinearAddNorm(nn.Module):
    """BERT's attention output: LayerNorm(x @ W + b + residual)."""

    def __init__(self):
        super().__init__()
        self.linear, self.norm = nn.Linear(48, 32), nn.LayerNorm(32)

    def forward(self, x, residual):
        return self.norm(residual + self.linear(x))


def _linear_add_norm():
    torch.manual_seed(0)
    return api.import_torch(LinearAddNorm(), [torch.randn(2, 8, 48), torch.randn(2, 8, 32)])


def test_layer_norm_joins_the_epilogue_of_its_gemm(tmp_path):
    model = _linear_add_norm()
    compiled = api.compile_model(model, api.get_target(HOST),
                                 api.BuildOptions(use_database=False))
    (group,) = compiled.analysis.groups
    assert group.rule == "tvmfuse.layer_norm_epilogue.bias_add"
    assert group.ops == ("matmul", "add", "add", "layer_norm")
    assert compiled.analysis.kernels == [group.name]
    assert compiled.analysis.implementations[group.name] == "cpu.dense_row_norm"
    checks = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert max(c.rel_err for c in checks) < 1e-5


def test_layer_norm_epilogue_is_off_where_the_rules_say_so(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(f"[{HOST}]\nlayer_norm_epilogue = {{ enabled = false }}\n")
    model = _linear_add_norm()
    for target, options in ((api.get_target(HOST), api.BuildOptions(fusion_rules=rules)),
                            (api.get_target("cuda-sm90"), api.BuildOptions())):
        _, analysis = api.analyze(model, target, options)
        # the GEMM keeps bias and residual; the LayerNorm is a kernel of its own
        assert [g.rule for g in analysis.groups] == ["tvmfuse.matmul_epilogue.bias_add"]
        assert len(analysis.kernels) == 2
