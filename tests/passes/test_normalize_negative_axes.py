import pytest
import torch
import tvm
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import NormalizeNegativeAxes
from tvmfuse.verify import verify

from conftest import HOST, relax_main


def test_negative_axes_count_from_the_front():
    before = relax_main({"x": (1, 64, 1, 1)}, lambda bb, x: relax.op.squeeze(x, [-2, -1]))
    expected = relax_main({"x": (1, 64, 1, 1)}, lambda bb, x: relax.op.squeeze(x, [2, 3]))
    tvm.ir.assert_structural_equal(NormalizeNegativeAxes()(before), expected)


def test_negative_permute_axes_count_from_the_front():
    before = relax_main({"x": (2, 3, 4, 5)},
                        lambda bb, x: relax.op.permute_dims(x, [0, -2, -1, 1]))
    expected = relax_main({"x": (2, 3, 4, 5)}, lambda bb, x: relax.op.permute_dims(x, [0, 2, 3, 1]))
    tvm.ir.assert_structural_equal(NormalizeNegativeAxes()(before), expected)


@pytest.mark.parametrize("op", [relax.op.squeeze, relax.op.permute_dims])
@pytest.mark.parametrize("axes", [[2], None])
def test_non_negative_or_all_axes_are_no_match(op, axes):
    if op is relax.op.permute_dims and axes is not None:
        axes = [0, 2, 1, 3]
    before = relax_main({"x": (1, 64, 1, 1)}, lambda bb, x: op(x, axes))
    tvm.ir.assert_structural_equal(NormalizeNegativeAxes()(before), before)


class ConvThenNegativePermute(torch.nn.Module):
    """Falcon-H1's ``permute(0, -2, -1, 1)`` beside a conv: "Invalid layout A?@B"."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x, y):
        return self.conv(x).mean(1), y.permute(0, -2, -1, 1) * 2


def test_negative_permute_beside_a_conv_builds_and_matches_pytorch(tmp_path):
    torch.manual_seed(0)
    model = api.import_torch(ConvThenNegativePermute().eval(),
                             [torch.randn(1, 3, 8, 8), torch.randn(2, 3, 4, 5)])
    assert "axes=[0, -2, -1, 1]" in model.mod["main"].script()  # as torch.export gives it
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    checks = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert max(c.rel_err for c in checks) < 1e-5


class ConvThenPoolSqueeze(torch.nn.Module):
    """A conv (which ConvertLayout turns NHWC), and Swin's pooling: mean over the last axes
    kept, reshaped to 4-D, squeezed at a negative axis. ConvertLayout died on it (bad_alloc)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 4, 4)

    def forward(self, x):
        y = self.conv(x).flatten(2).transpose(1, 2)  # (1, 16 tokens, 16 channels)
        pooled = y.transpose(1, 2).unsqueeze(-2).mean((-1, -2), keepdim=True)
        return pooled.reshape(1, 16, 1, 1).squeeze(-2).squeeze(-1)


def test_swin_style_pooling_builds_and_matches_pytorch(tmp_path):
    torch.manual_seed(0)
    model = api.import_torch(ConvThenPoolSqueeze().eval(), [torch.randn(1, 3, 16, 16)])
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-5
