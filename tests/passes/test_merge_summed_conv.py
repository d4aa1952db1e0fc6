import numpy as np
import torch
import tvm
from torch import nn
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import MergeSummedConv

from conftest import HOST, relax_main

rng = np.random.default_rng(0)
WA = rng.standard_normal((1, 1, 8, 16)).astype("float32")  # HWIO
WB = rng.standard_normal((1, 1, 4, 16)).astype("float32")
BA, BB = (rng.standard_normal((1, 1, 1, 16)).astype("float32") for _ in range(2))
NHWC = {"data_layout": "NHWC", "kernel_layout": "HWIO", "out_layout": "NHWC"}


def _module(body):
    return relax_main({"h": (1, 6, 6, 8), "x": (1, 12, 12, 4)}, body)


def _summed(wb=WB, padding_b=0, keep_b=False):
    def body(bb, h, x):
        a = bb.emit(relax.op.nn.conv2d(h, relax.const(WA), **NHWC))
        a = bb.emit(relax.op.add(a, relax.const(BA)))
        b = bb.emit(relax.op.nn.conv2d(x, relax.const(wb), strides=2, padding=padding_b, **NHWC))
        b = bb.emit(relax.op.add(b, relax.const(BB)))
        total = bb.emit(relax.op.add(a, b))
        out = bb.emit(relax.op.nn.relu(total))
        return relax.Tuple([out, b]) if keep_b else out

    return _module(body)


def test_two_summed_1x1_convs_become_one_conv_over_concatenated_inputs():
    def body(bb, h, x):
        sub = relax.op.strided_slice(x, [1, 2], [0, 0], [12, 12], [2, 2])
        data = relax.op.concat([h, sub], axis=3)
        y = relax.op.nn.conv2d(data, relax.const(np.concatenate([WA, WB], axis=2)), **NHWC)
        y = bb.emit(y)
        y = bb.emit(relax.op.add(y, relax.const(BA + BB)))
        return relax.op.nn.relu(y)

    tvm.ir.assert_structural_equal(MergeSummedConv()(_summed()), _module(body))


def test_a_padded_3x3_conv_is_not_merged():
    before = _summed(wb=rng.standard_normal((3, 3, 4, 16)).astype("float32"), padding_b=1)
    tvm.ir.assert_structural_equal(MergeSummedConv()(before), before)


def test_a_conv_whose_output_is_used_elsewhere_is_not_merged():
    before = _summed(keep_b=True)
    tvm.ir.assert_structural_equal(MergeSummedConv()(before), before)


class Downsample(nn.Module):
    """A ResNet bottleneck's end: conv3(h) + BN + downsample(x) (stride 2) + BN, then ReLU."""

    def __init__(self):
        super().__init__()
        self.conv3, self.bn3 = nn.Conv2d(8, 32, 1, bias=False), nn.BatchNorm2d(32)
        self.down = nn.Sequential(nn.Conv2d(16, 32, 1, stride=2, bias=False), nn.BatchNorm2d(32))
        for bn in (self.bn3, self.down[1]):
            nn.init.uniform_(bn.weight, 0.5, 1.5)
            nn.init.uniform_(bn.running_var, 0.5, 1.5)
            nn.init.normal_(bn.running_mean)
            nn.init.normal_(bn.bias)

    def forward(self, h, x):
        return torch.relu(self.bn3(self.conv3(h)) + self.down(x))


def test_downsample_block_is_one_kernel_and_matches_pytorch(tmp_path):
    torch.manual_seed(0)
    module = Downsample().eval()
    h, x = torch.randn(1, 8, 7, 7), torch.randn(1, 16, 14, 14)
    model = api.import_torch(module, [h, x])
    compiled = api.compile_model(model, api.get_target(HOST),
                                 api.BuildOptions(use_database=False))
    convs = [g for g in compiled.analysis.groups if "conv2d" in g.ops]
    assert len(convs) == 1
    assert convs[0].ops == ("strided_slice", "concatenate", "conv2d", "add", "relu")
    assert convs[0].rule == "tvmfuse.conv_epilogue.bias_relu"
    (out,) = api.load(api.build(compiled, tmp_path / "out")).run([h.numpy(), x.numpy()])
    with torch.no_grad():
        expected = module(h, x).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
