import pytest
import torch
import tvm
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import FoldPadIntoConv
from tvmfuse.verify import verify

from conftest import HOST, relax_main

PARAMS = {"x": (1, 8, 16, 16), "w": (8, 1, 3, 3)}


def test_spatial_zero_pad_becomes_the_convs_asymmetric_padding():
    before = relax_main(PARAMS, lambda bb, x, w: relax.op.nn.conv2d(
        bb.emit(relax.op.nn.pad(x, [0, 0, 0, 0, 0, 1, 0, 1])), w, strides=2, padding=[1, 0, 0, 0],
        groups=8))
    expected = relax_main(PARAMS, lambda bb, x, w: relax.op.nn.conv2d(
        x, w, strides=2, padding=[1, 0, 1, 1], groups=8))
    tvm.ir.assert_structural_equal(FoldPadIntoConv()(before), expected)


@pytest.mark.parametrize("widths, value, mode", [
    ([0, 0, 1, 0, 0, 1, 0, 1], 0.0, "constant"),  # pads channels too
    ([0, 0, 0, 0, 0, 1, 0, 1], 1.0, "constant"),  # not zeros
    ([0, 0, 0, 0, 1, 1, 1, 1], 0.0, "reflect"),
])
def test_other_pads_are_no_match(widths, value, mode):
    params = {"x": (1, 7, 16, 16), "w": (8, 8, 3, 3)} if widths[2] else PARAMS
    groups = 1 if widths[2] else 8
    before = relax_main(params, lambda bb, x, w: relax.op.nn.conv2d(
        bb.emit(relax.op.nn.pad(x, widths, pad_mode=mode, pad_value=value)), w, groups=groups))
    tvm.ir.assert_structural_equal(FoldPadIntoConv()(before), before)


class SamePaddedDepthwise(torch.nn.Module):
    """EfficientNet's strided depthwise conv with TensorFlow-style "same" padding."""

    def __init__(self):
        super().__init__()
        self.pad = torch.nn.ZeroPad2d((0, 1, 0, 1))
        self.conv = torch.nn.Conv2d(16, 16, 3, 2, groups=16, bias=False)

    def forward(self, x):
        return torch.nn.functional.silu(self.conv(self.pad(x)))


def test_same_padded_depthwise_has_no_pad_or_transpose_kernel_and_matches_pytorch(tmp_path):
    torch.manual_seed(0)
    model = api.import_torch(SamePaddedDepthwise().eval(), [torch.randn(1, 16, 28, 28)])
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    ops = [op for g in compiled.analysis.groups for op in g.ops]
    assert "pad" not in ops
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-5
