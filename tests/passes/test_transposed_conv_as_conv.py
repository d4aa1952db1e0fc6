import pytest
import torch
import tvm
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import TransposedConvAsConv
from tvmfuse.verify import verify

from conftest import HOST, relax_main


def test_strided_transposed_conv_becomes_a_conv_over_the_dilated_input():
    """Stride 2, kernel 3, padding 1, output padding 1: the 4x5 input gets a zero after each
    pixel (8x10, its last row and column zeros already), padding 1 before and 1 after (the
    output padding less the trailing zero), and the 3 -> 5 weight swapped and flipped."""
    params = {"x": (1, 3, 4, 5), "w": (3, 5, 3, 3)}
    before = relax_main(params, lambda bb, x, w: relax.op.nn.conv2d_transpose(
        x, w, strides=2, padding=1, output_padding=1))

    def expected_body(bb, x, w):
        split = bb.emit(relax.op.reshape(x, [1, 3, 4, 1, 5, 1]))
        padded = bb.emit(relax.op.nn.pad(split, [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1]))
        dilated = bb.emit(relax.op.reshape(padded, [1, 3, 8, 10]))
        weight = bb.emit(relax.op.reshape(w, [1, 3, 5, 3, 3]))
        weight = bb.emit(relax.op.permute_dims(weight, [0, 2, 1, 3, 4]))
        weight = bb.emit(relax.op.reshape(weight, [5, 3, 3, 3]))
        weight = bb.emit(relax.op.flip(weight, 2))
        weight = bb.emit(relax.op.flip(weight, 3))
        return relax.op.nn.conv2d(dilated, weight, padding=(1, 1, 1, 1))

    expected = relax_main(params, expected_body)
    after = TransposedConvAsConv()(before)
    tvm.ir.assert_structural_equal(relax.transform.Normalize()(after),
                                   relax.transform.Normalize()(expected))


def test_other_layouts_are_no_match():
    params = {"x": (1, 4, 5, 3), "w": (3, 5, 3, 3)}
    before = relax_main(params, lambda bb, x, w: relax.op.nn.conv2d_transpose(
        x, w, strides=2, data_layout="NHWC", out_layout="NHWC"))
    tvm.ir.assert_structural_equal(TransposedConvAsConv()(before), before)


class Decoder(torch.nn.Module):
    """A transposed conv with its bias, then ReLU (a decoder's upsampling step)."""

    def __init__(self, conv: torch.nn.Module):
        super().__init__()
        self.conv = conv

    def forward(self, x):
        return torch.relu(self.conv(x))


#: (in, out, kernel, stride, padding, output padding, groups, dilation): kernel equal to the
#: stride (DPT, U-Net), odd channels, padding beyond dilation * (kernel - 1) (the dilated input
#: is cropped), output padding, groups, dilation, stride 3.
CASES = [
    (3, 5, 3, 2, 1, 1, 1, 1), (3, 5, 2, 2, 0, 0, 1, 1), (3, 5, 4, 4, 0, 0, 1, 1),
    (4, 6, 4, 2, 1, 0, 2, 1), (3, 5, 3, 3, 0, 2, 1, 2), (3, 5, 4, 1, 1, 0, 1, 2),
    (3, 5, 2, 3, 2, 1, 1, 1), (4, 6, 3, 2, 0, 1, 2, 2),
]


@pytest.mark.parametrize("rank", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(map(str, case)))
def test_matches_pytorch_on_the_conv_path(tmp_path, case, rank):
    """Over a 7x9 map (7 frames in 1-D), through the whole pipeline: no transposed conv is
    left, a conv2d kernel does the work, and the numbers are PyTorch's."""
    cin, cout, kernel, stride, padding, extra, groups, dilation = case
    torch.manual_seed(0)
    conv = (torch.nn.ConvTranspose2d if rank == 2 else torch.nn.ConvTranspose1d)(
        cin, cout, kernel, stride, padding, extra, groups, dilation=dilation)
    model = api.import_torch(Decoder(conv).eval(),
                             [torch.randn(1, cin, 7, 9) if rank == 2 else torch.randn(1, cin, 7)])
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    assert not any("conv1d_transpose" in name or "conv2d_transpose" in name
                   for name in compiled.analysis.kernels), compiled.analysis.kernels
    assert any("conv2d" in name for name in compiled.analysis.kernels), compiled.analysis.kernels
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-5


def test_cuda_compiles_a_transposed_conv():
    """The CUDA strategy takes the rewritten conv too (code generated here, no GPU needed)."""
    torch.manual_seed(0)
    model = api.import_torch(Decoder(torch.nn.ConvTranspose2d(6, 5, 4, 2, 1)).eval(),
                             [torch.randn(1, 6, 7, 9)])
    compiled = api.compile_model(model, api.get_target("cuda-sm90"), api.BuildOptions())
    assert not any("conv2d_transpose" in name for name in compiled.analysis.kernels)
    assert "conv2d" in " ".join(compiled.analysis.kernels), compiled.analysis.kernels


def test_dpt_depth_estimator_builds_and_matches_pytorch(tmp_path):
    """transformers' DPT at a small config: its reassemble stage upsamples with ConvTranspose2d
    (kernel and stride 4, then 2), which had no lowering once the convs were NHWC."""
    import transformers as tf

    from tvmfuse.zoo.suite import Field

    torch.manual_seed(0)
    config = tf.DPTConfig(hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
                          intermediate_size=128, image_size=64, patch_size=16,
                          backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[16, 32, 48, 64],
                          fusion_hidden_size=32)
    depth = Field(tf.DPTForDepthEstimation(config).eval(), "predicted_depth")
    model = api.import_torch(depth, [torch.randn(1, 3, 64, 64)])
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-5
