"""Conv and matmul epilogue patterns: which ops end up in one kernel, and the numbers."""

import numpy as np
import pytest
import torch
from torch import nn

from tvmfuse import api
from tvmfuse.verify import verify

from conftest import HOST


class QuickGELU(nn.Module):
    """CLIP's activation."""

    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


ACTIVATIONS = {
    "relu": nn.ReLU(), "clip": nn.ReLU6(), "silu": nn.SiLU(), "gelu": nn.GELU(),
    "sigmoid": nn.Sigmoid(), "hardswish": nn.Hardswish(), "tanh": nn.Tanh(),
    "quick_gelu": QuickGELU(),
}


class ConvBNAct(nn.Module):
    def __init__(self, act: nn.Module):
        super().__init__()
        self.conv, self.bn, self.act = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), act
        with torch.no_grad():
            self.bn.running_mean.normal_(0, 0.1)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


def _compute_kernels(analysis) -> list[str]:
    """The kernels that compute: without the NHWC transposes at the model's input and output."""
    return [k for k in analysis.kernels if not k.startswith("transpose")]


def _groups(model, rules=None):
    options = api.BuildOptions(fusion_rules=rules)
    _, analysis = api.analyze(model, api.get_target(HOST), options)
    return analysis


def _build_and_verify(model, tmp_path, rules=None):
    options = api.BuildOptions(fusion_rules=rules)
    compiled = api.compile_model(model, api.get_target(HOST), options)
    return verify(api.load(api.build(compiled, tmp_path / "out")), model)


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_conv_bn_activation_is_one_kernel(act, tmp_path):
    torch.manual_seed(0)
    model = api.import_torch(ConvBNAct(ACTIVATIONS[act]), [torch.randn(1, 3, 16, 16)])
    analysis = _groups(model)
    assert len(_compute_kernels(analysis)) == 1
    (group,) = analysis.groups
    # on CPUs a clip (ReLU6, and hardswish's gate) is matched as DecomposeClip leaves it
    expected = {"clip": "minmax", "hardswish": "hardswish_minmax"}.get(act, act)
    assert group.rule == f"tvmfuse.conv_epilogue.bias_{expected}"
    # the input's NHWC transpose is the kernel's prologue; BN folded: only the bias add is left
    assert group.ops[:3] == ("transpose", "conv2d", "add")
    assert "subtract" not in group.ops and "divide" not in group.ops[:4]
    _build_and_verify(model, tmp_path)


class Residual(nn.Module):
    """A stem conv, then an identity residual in the operand order ``y + f(y)``."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.conv, self.bn = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        with torch.no_grad():
            self.bn.running_mean.normal_(0, 0.1)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = torch.relu(self.stem(x))
        return torch.relu(y + self.bn(self.conv(y)))


def test_conv_residual_add_relu_is_one_kernel(tmp_path):
    torch.manual_seed(0)
    model = api.import_torch(Residual().eval(), [torch.randn(1, 3, 16, 16)])
    analysis = _groups(model)
    residual = [g for g in analysis.groups if g.rule == "tvmfuse.conv_epilogue.bias_add_relu"]
    assert [g.ops for g in residual] == [("conv2d", "add", "add", "relu")]
    # the stem (with the input's NHWC transpose), the residual block, the output's NCHW transpose
    assert analysis.summary.kernels == len(analysis.kernels) == 3
    _build_and_verify(model, tmp_path)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(x)))


def test_linear_gelu_and_linear_residual_are_one_kernel_each(tmp_path):
    torch.manual_seed(0)
    model = api.import_torch(Mlp(), [torch.randn(2, 8, 32)])
    analysis = _groups(model)
    assert sorted(g.rule for g in analysis.groups) == [
        "tvmfuse.matmul_epilogue.bias_add", "tvmfuse.matmul_epilogue.bias_gelu",
    ]
    assert len(analysis.kernels) == 2  # the reshapes around each matmul are gone
    _build_and_verify(model, tmp_path)


class ConvAbs(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return torch.abs(self.conv(x))


def test_an_op_outside_the_patterns_is_left_to_fuse_ops():
    model = api.import_torch(ConvAbs(), [torch.randn(1, 3, 8, 8)])
    groups = _groups(model).groups
    (group,) = [g for g in groups if "conv2d" in g.ops]
    assert group.rule == "tvmfuse.conv_epilogue.bias"  # abs is no epilogue
    assert group.ops == ("transpose", "conv2d", "add")  # the NHWC transpose of the input
    # FuseOps puts abs with the output's layout transpose back to NCHW
    assert [g.ops for g in groups if g is not group] == [("tir_abs", "transpose")]


def test_max_group_size_splits_a_long_epilogue(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text("[default]\nconv_epilogue = { max_group_size = 2 }\n")
    torch.manual_seed(0)
    model = api.import_torch(ConvBNAct(nn.SiLU()), [torch.randn(1, 3, 16, 16)])
    analysis = _groups(model, rules)
    conv_group = next(g for g in analysis.groups if "conv2d" in g.ops)
    assert conv_group.rule == "tvmfuse.conv_epilogue.bias"
    assert len(_compute_kernels(analysis)) == 2
    _build_and_verify(model, tmp_path, rules)


def test_disabled_family_isolates_its_anchors(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(f"[{HOST}]\nconv_epilogue = {{ enabled = false }}\n")
    model = api.import_model("tiny-resnet")
    analysis = _groups(model, rules)
    assert not any("conv2d" in g.ops for g in analysis.groups)
    assert len(analysis.kernels) > 7
    checks = _build_and_verify(model, tmp_path, rules)
    assert np.all([c.ok for c in checks])


class AddN(nn.Module):
    """A chain of adds (AddN), as a sum of branch outputs leaves it."""

    def forward(self, a, b, c, d):
        return torch.relu(a + b + c + d)


def test_a_chain_of_adds_is_one_kernel(tmp_path):
    model = api.import_torch(AddN(), [torch.randn(2, 16, 32) for _ in range(4)])
    analysis = _groups(model)
    (group,) = analysis.groups
    assert group.rule == "elementwise" and group.ops == ("add", "add", "add", "relu")
    assert len(analysis.kernels) == 1
    checks = _build_and_verify(model, tmp_path)
    assert max(c.rel_err for c in checks) < 1e-6
