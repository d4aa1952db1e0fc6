"""WinogradConv2D (the ``winograd_conv2d`` rule): which convs become Winograd's three kernels, how
they are fused and scheduled, and the numbers against PyTorch."""

import re

import numpy as np
import pytest
import torch
from torch import nn

from tvmfuse import api
from tvmfuse.names import LAYOUT_REWRITE_PREPROC
from tvmfuse.passes.winograd_conv2d import (
    INPUT_TRANSFORM,
    MIN_CHANNELS,
    MIN_TILES,
    OUTPUT_TRANSFORM,
    transform_weight,
)
from tvmfuse.verify import verify

from conftest import HOST


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
    def __init__(self, channels: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
        self.down = nn.Conv2d(32, 32, 3, stride=2, padding=1)  # strided: stays direct

    def forward(self, x):
        return self.down(torch.relu(self.conv2(torch.relu(self.conv1(x)))))


def _analyze(size: int, tmp_path, until: str, channels: int = 32):
    rules = tmp_path / "rules.toml"
    rules.write_text(f"[{HOST}]\nwinograd_conv2d = {{ enabled = true }}\n")
    torch.manual_seed(0)
    model = api.import_torch(Block(channels).eval(), [torch.randn(1, channels, size, size)])
    options = api.BuildOptions(fusion_rules=rules, use_database=False)
    mod, analysis = api.analyze(model, api.get_target(HOST), options, until=until)
    return model, options, mod, analysis


# 12x12 and 15x15 (odd: the last tiles cropped) have 36 and 64 tiles of 2x2 outputs
@pytest.mark.parametrize("size", [12, 15])
def test_the_rule_rewrites_stride_one_3x3_convs_and_matches_pytorch(size, tmp_path):
    model, options, mod, _ = _analyze(size, tmp_path, "fold")
    script = mod.script(show_meta=False)
    assert script.count("R.nn.conv2d(") == 1  # only the strided conv is left
    assert script.count(f"cls.{INPUT_TRANSFORM}") == 2
    assert script.count("R.matmul(") == 2  # the 16 products of each conv: one batched matmul
    assert script.count(f"cls.{OUTPUT_TRANSFORM}") == 2

    _, _, scheduled, analysis = _analyze(size, tmp_path, "schedule")
    kernels = set(analysis.kernels)
    # the 16 products: a batched GEMM of the dense rule, its transformed weights packed in panels
    products = [k for k in kernels if k.startswith("matmul")]
    assert products and all(analysis.implementations[k] == "cpu.dense" for k in products)
    assert all(LAYOUT_REWRITE_PREPROC in scheduled[k].script() for k in products)
    # each conv's bias and ReLU are fused into its output transform (one kernel for both convs:
    # the same shapes), and the first conv's ReLU is not computed again in the second's input
    outputs = [k for k in analysis.kernels if k.startswith(f"fused_{OUTPUT_TRANSFORM}")]
    assert len(outputs) == 2 and all(k.endswith("_relu") for k in outputs), outputs
    assert sum(k.startswith(INPUT_TRANSFORM) for k in analysis.kernels) == 2
    implementations = analysis.implementations
    assert all(implementations[k] == "cpu.winograd_transform"
               for k in kernels if k.startswith(INPUT_TRANSFORM))
    assert {implementations[k] for k in outputs} == (
        {"cpu.winograd_transform"} if size % 2 == 0 else {"cpu.elementwise"})  # odd: cropped

    compiled = api.compile_model(model, api.get_target(HOST), options)
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-5


# 6x6 has 9 tiles, under MIN_TILES: the transformed weights would be read too few times; a
# 16-channel input is under MIN_CHANNELS: the products' reduction is too short to pay
@pytest.mark.parametrize(("size", "channels", "direct"), [(6, 32, 3), (12, 16, 2)])
def test_convs_with_few_tiles_or_channels_stay_direct(size, channels, direct, tmp_path):
    assert 9 < MIN_TILES and 16 < MIN_CHANNELS
    _, _, mod, _ = _analyze(size, tmp_path, "fold", channels)
    script = mod.script(show_meta=False)
    assert script.count("R.nn.conv2d(") == direct
    assert script.count(f"cls.{INPUT_TRANSFORM}") == 3 - direct


def test_an_output_transform_before_the_nchw_transpose_is_left_to_the_elementwise_rule(tmp_path):
    """The model's last conv: FuseOps joins the layout transpose back to NCHW to its output
    transform, which the Winograd rule (NHWC loops) must not take."""
    rules = tmp_path / "rules.toml"
    rules.write_text(f"[{HOST}]\nwinograd_conv2d = {{ enabled = true }}\n")
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.ReLU()).eval()
    model = api.import_torch(module, [torch.randn(1, 32, 12, 12)])
    options = api.BuildOptions(fusion_rules=rules, use_database=False)
    _, analysis = api.analyze(model, api.get_target(HOST), options, until="schedule")
    (output,) = [k for k in analysis.kernels if k.startswith(f"fused_{OUTPUT_TRANSFORM}")]
    assert "transpose" in output and analysis.implementations[output] == "cpu.elementwise"
    compiled = api.compile_model(model, api.get_target(HOST), options)
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-5


def _vector_widths(script: str) -> list[int]:
    """The widths of the vectorized loops of a kernel's TVMScript, in order (``T.vectorized(16)``
    or, partitioned, ``T.vectorized(32, 40)``)."""
    widths = []
    for bounds in re.findall(r"T\.vectorized\((.*)\):", script.replace("T.int64", "")):
        numbers = [int(n) for n in re.findall(r"\d+", bounds)]
        widths.append(numbers[0] if len(numbers) == 1 else numbers[1] - numbers[0])
    return widths


def test_transforms_over_channels_no_vector_divides_keep_full_vectors(tmp_path):
    """3x3 convs 45 -> 45 -> 32 (PadConvChannels computes 48 output channels of the first; its
    output transform writes 45, the second's input transform reads 45): those transforms run
    the channels innermost, as whole vectors and a tail of narrower ones (45 = 2 x 16 + 8 + 4 + 1
    on AVX-512; one lane at a time they took 124 of a 77-channel conv's 344 us), and the numbers
    match PyTorch."""
    rules = tmp_path / "rules.toml"
    rules.write_text(f"[{HOST}]\nwinograd_conv2d = {{ enabled = true }}\n")
    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(45, 45, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(45, 32, 3, padding=1)).eval()
    model = api.import_torch(block, [torch.randn(1, 45, 12, 12)])
    options = api.BuildOptions(fusion_rules=rules, use_database=False)
    target = api.get_target(HOST)
    scheduled, analysis = api.analyze(model, target, options, until="schedule")
    inputs = [k for k in analysis.kernels if k.startswith(INPUT_TRANSFORM)]
    outputs = [k for k in analysis.kernels if k.startswith(f"fused_{OUTPUT_TRANSFORM}")
               and "transpose" not in k]  # the last conv's writes NCHW: the elementwise rule's
    assert len(inputs) == 2 and len(outputs) == 1
    lanes = target.vector.lanes
    tail = [w for w in (8, 4, 2) if 45 % lanes & w]
    for kernel in [*inputs, *outputs]:
        assert analysis.implementations[kernel] == "cpu.winograd_transform"
        # whole vectors first, then the tail's pieces (a piece of one is a plain loop)
        assert _vector_widths(scheduled[kernel].script()) == [lanes, *tail]
    compiled = api.compile_model(model, target, options)
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-5
