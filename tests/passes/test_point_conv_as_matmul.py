import pytest
import torch
import tvm
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import PointConvAsMatmul
from tvmfuse.verify import verify

from conftest import HOST, relax_main


@pytest.mark.parametrize("kernel_layout,weight", [("HWIO", (1, 1, 40, 10)),
                                                  ("OHWI", (10, 1, 1, 40))])
def test_1x1_conv_over_a_1x1_map_becomes_a_matmul(kernel_layout, weight):
    params = {"x": (2, 1, 1, 40), "w": weight}
    before = relax_main(params, lambda bb, x, w: relax.op.nn.conv2d(
        x, w, data_layout="NHWC", kernel_layout=kernel_layout))

    def matmul(bb, x, w):
        if kernel_layout == "HWIO":
            matrix = bb.emit(relax.op.reshape(w, [40, 10]))
        else:
            matrix = bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(w, [10, 40])), [1, 0]))
        return relax.op.matmul(x, matrix)

    expected = relax_main(params, matmul)
    after = PointConvAsMatmul()(before)
    tvm.ir.assert_structural_equal(relax.transform.Normalize()(after),
                                   relax.transform.Normalize()(expected))


@pytest.mark.parametrize("x,w,kw", [
    ((1, 2, 2, 40), (1, 1, 40, 10), {}),  # a 2x2 map: a conv's rows
    ((1, 1, 1, 40), (3, 3, 40, 10), {"padding": 1}),  # a 3x3 window over padding
    ((1, 1, 1, 40), (1, 1, 8, 10), {"groups": 5}),  # grouped
])
def test_other_convs_are_no_match(x, w, kw):
    before = relax_main({"x": x, "w": w}, lambda bb, x, w: relax.op.nn.conv2d(
        x, w, data_layout="NHWC", kernel_layout="HWIO", **kw))
    tvm.ir.assert_structural_equal(PointConvAsMatmul()(before), before)


class SqueezeExcite(torch.nn.Module):
    """RegNet-Y's: a 3x3 conv, the global mean, 44 -> 11 (no vector divides 11) -> 44 1x1
    convs, the scaling."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 44, 3, padding=1)
        self.reduce = torch.nn.Conv2d(44, 11, 1)
        self.expand = torch.nn.Conv2d(11, 44, 1)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        scale = x.mean((2, 3), keepdim=True)
        scale = torch.sigmoid(self.expand(torch.relu(self.reduce(scale))))
        return x * scale


def test_squeeze_excite_takes_the_gemm_schedule_and_matches_pytorch(tmp_path):
    torch.manual_seed(0)
    model = api.import_torch(SqueezeExcite().eval(), [torch.randn(1, 16, 9, 9)])
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    implementations = list(compiled.analysis.implementations.values())
    assert implementations.count("cpu.dense") == 2 and "cpu.parallel" not in implementations
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-5
