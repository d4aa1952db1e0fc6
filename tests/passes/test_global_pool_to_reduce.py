import pytest
import torch
import tvm
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import GlobalPoolToReduce
from tvmfuse.verify import verify

from conftest import HOST, relax_main


def test_a_window_over_the_whole_input_becomes_a_spatial_mean():
    before = relax_main({"x": (1, 8, 7, 7)}, lambda bb, x: relax.op.nn.avg_pool2d(
        x, pool_size=1280, strides=1280, ceil_mode=True))
    expected = relax_main({"x": (1, 8, 7, 7)}, lambda bb, x: relax.op.mean(
        x, axis=[2, 3], keepdims=True))
    tvm.ir.assert_structural_equal(GlobalPoolToReduce()(before), expected)


def test_max_pool_becomes_a_spatial_max():
    before = relax_main({"x": (1, 7, 7, 8)}, lambda bb, x: relax.op.nn.max_pool2d(
        x, pool_size=7, layout="NHWC"))
    expected = relax_main({"x": (1, 7, 7, 8)}, lambda bb, x: relax.op.max(
        x, axis=[1, 2], keepdims=True))
    tvm.ir.assert_structural_equal(GlobalPoolToReduce()(before), expected)


@pytest.mark.parametrize("kwargs", [dict(pool_size=3, strides=2),  # many windows
                                    dict(pool_size=7, padding=1, ceil_mode=True)])  # padded
def test_other_pools_are_no_match(kwargs):
    before = relax_main({"x": (1, 8, 7, 7)}, lambda bb, x: relax.op.nn.avg_pool2d(x, **kwargs))
    tvm.ir.assert_structural_equal(GlobalPoolToReduce()(before), before)


class EfficientNetHead(torch.nn.Module):
    """transformers' EfficientNet pooler: AvgPool2d(hidden_dim, ceil_mode=True) on a 7x7 map."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 16, 1)
        self.pool = torch.nn.AvgPool2d(1280, ceil_mode=True)

    def forward(self, x):
        return self.pool(self.conv(x)).flatten(1)


def test_efficientnet_head_matches_pytorch(tmp_path):
    torch.manual_seed(0)
    model = api.import_torch(EfficientNetHead().eval(), [torch.randn(1, 8, 7, 7)])
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    assert not any("pool" in name for name in compiled.analysis.kernels)
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-5
