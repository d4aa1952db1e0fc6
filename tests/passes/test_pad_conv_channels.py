import pytest
import torch
import tvm
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import PadConvChannels
from tvmfuse.verify import verify

from conftest import HOST, relax_main


def test_output_channels_padded_to_whole_vectors_then_sliced():
    params = {"x": (1, 9, 9, 16), "w": (3, 3, 16, 77)}
    before = relax_main(params, lambda bb, x, w: relax.op.nn.conv2d(
        x, w, padding=1, data_layout="NHWC", kernel_layout="HWIO"))

    def padded(bb, x, w):
        wide = bb.emit(relax.op.nn.pad(w, [0, 0, 0, 0, 0, 0, 0, 3]))
        conv = bb.emit(relax.op.nn.conv2d(x, wide, padding=1, data_layout="NHWC",
                                          kernel_layout="HWIO"))
        return relax.op.strided_slice(conv, axes=[3], begin=[0], end=[77])

    after = PadConvChannels(8)(before)
    tvm.ir.assert_structural_equal(relax.transform.Normalize()(after),
                                   relax.transform.Normalize()(relax_main(params, padded)))


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_input_channels_padded_with_its_spatial_padding_where_stride_is_one(stride):
    """A depthwise conv's input channels are padded too, in one copy with the spatial padding
    at stride 1; a strided conv keeps its padding to read through."""
    params = {"x": (1, 9, 9, 77), "w": (3, 3, 1, 77)}
    before = relax_main(params, lambda bb, x, w: relax.op.nn.conv2d(
        x, w, strides=stride, padding=1, groups=77, data_layout="NHWC", kernel_layout="HWIO"))

    def padded(bb, x, w):
        spatial = [1, 1, 1, 1] if stride == 1 else [0, 0, 0, 0]
        wide = bb.emit(relax.op.nn.pad(x, [0, 0, *spatial, 0, 3]))
        weights = bb.emit(relax.op.nn.pad(w, [0, 0, 0, 0, 0, 0, 0, 3]))
        conv = bb.emit(relax.op.nn.conv2d(
            wide, weights, strides=stride, padding=0 if stride == 1 else 1, groups=80,
            data_layout="NHWC", kernel_layout="HWIO"))
        return relax.op.strided_slice(conv, axes=[3], begin=[0], end=[77])

    after = PadConvChannels(8)(before)
    tvm.ir.assert_structural_equal(relax.transform.Normalize()(after),
                                   relax.transform.Normalize()(relax_main(params, padded)))


def test_depthwise_channels_a_narrower_vector_divides_are_padded_too():
    """72 channels and 16 lanes: a depthwise conv is padded to 80 (it ran in 8-lane vectors,
    half as fast), a dense conv to 72 channels keeps its 8-lane tiles."""
    params = {"x": (1, 9, 9, 72), "w": (3, 3, 1, 72)}
    depthwise = relax_main(params, lambda bb, x, w: relax.op.nn.conv2d(
        x, w, padding=1, groups=72, data_layout="NHWC", kernel_layout="HWIO"))

    def padded(bb, x, w):
        wide = bb.emit(relax.op.nn.pad(x, [0, 0, 1, 1, 1, 1, 0, 8]))
        weights = bb.emit(relax.op.nn.pad(w, [0, 0, 0, 0, 0, 0, 0, 8]))
        conv = bb.emit(relax.op.nn.conv2d(wide, weights, padding=0, groups=80,
                                          data_layout="NHWC", kernel_layout="HWIO"))
        return relax.op.strided_slice(conv, axes=[3], begin=[0], end=[72])

    tvm.ir.assert_structural_equal(relax.transform.Normalize()(PadConvChannels(16)(depthwise)),
                                   relax.transform.Normalize()(relax_main(params, padded)))
    dense = relax_main({"x": (1, 9, 9, 16), "w": (3, 3, 16, 72)}, lambda bb, x, w: (
        relax.op.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="HWIO")))
    tvm.ir.assert_structural_equal(PadConvChannels(16)(dense), dense)


def test_whole_vectors_grouped_and_nchw_convs_are_no_match():
    cases = [((1, 9, 9, 16), (3, 3, 16, 80), {}),  # already whole vectors
             ((1, 9, 9, 16), (3, 3, 16, 20), {}),  # vectors of 4
             ((1, 9, 9, 16), (3, 3, 4, 20), {"groups": 4}),  # grouped
             ((1, 9, 9, 10), (3, 3, 1, 20), {"groups": 10}),  # two outputs a group
             ((1, 9, 9, 16), (3, 3, 16, 4), {})]  # under one vector
    for x, w, kw in cases:
        before = relax_main({"x": x, "w": w}, lambda bb, x, w: relax.op.nn.conv2d(
            x, w, data_layout="NHWC", kernel_layout="HWIO", **kw))
        tvm.ir.assert_structural_equal(PadConvChannels(8)(before), before)
    nchw = relax_main({"x": (1, 16, 9, 9), "w": (77, 16, 3, 3)},
                      lambda bb, x, w: relax.op.nn.conv2d(x, w))
    tvm.ir.assert_structural_equal(PadConvChannels(8)(nchw), nchw)


def test_odd_channels_take_the_conv_schedule_and_match_pytorch(tmp_path):
    """3x3 convs to 77 and 45 channels (a bias and ReLU each): register-blocked, not the
    catch-all schedule (3 GFLOP/s), the padded channels sliced off."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 77, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(77, 45, 3, stride=2, padding=1)).eval()
    imported = api.import_torch(model, [torch.randn(1, 16, 15, 15)])
    compiled = api.compile_model(imported, api.get_target(HOST), api.BuildOptions())
    implementations = list(compiled.analysis.implementations.values())
    assert implementations.count("cpu.conv2d") == 2 and "cpu.parallel" not in implementations
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), imported)
    assert check.rel_err < 1e-5


@pytest.mark.parametrize("channels", [77, 72])
def test_depthwise_convs_over_odd_channels_take_the_depthwise_schedule(channels, tmp_path):
    """Depthwise 3x3 convs over 77 (or 72) channels, stride 1 and 2 (a bias and ReLU each): the
    depthwise schedule over 80 channels (the catch-all ran 197 channels at 5-7 GFLOP/s), the
    input copied once, and PyTorch's numbers."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels), torch.nn.ReLU(),
        torch.nn.Conv2d(channels, channels, 3, stride=2, padding=1, groups=channels)).eval()
    imported = api.import_torch(model, [torch.randn(1, channels, 15, 15)])
    compiled = api.compile_model(imported, api.get_target(HOST), api.BuildOptions())
    implementations = compiled.analysis.implementations
    assert list(implementations.values()).count("cpu.depthwise_conv2d") == 2
    assert "cpu.parallel" not in implementations.values()
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), imported)
    assert check.rel_err < 1e-5


def test_a_bf16_conv_over_odd_input_channels_reads_one_zero_channel_more_on_a_pair_core():
    """An RGB stem in bf16, for a core with the bf16 pair dot product: one zero input channel
    and a zero weight for it (the 77 output channels padded and sliced as before); in float32,
    or without the pair instruction, the input channels stay 3."""
    params = {"x": (1, 9, 9, 3), "w": (3, 3, 3, 77)}

    def conv(bb, x, w):
        return relax.op.nn.conv2d(x, w, strides=2, padding=1, data_layout="NHWC",
                                  kernel_layout="HWIO", out_dtype="float32")

    def paired(bb, x, w):
        data = bb.emit(relax.op.nn.pad(x, [0, 0, 0, 0, 0, 0, 0, 1]))
        weights = bb.emit(relax.op.nn.pad(w, [0, 0, 0, 0, 0, 1, 0, 0]))
        wide = bb.emit(relax.op.nn.pad(weights, [0, 0, 0, 0, 0, 0, 0, 3]))
        out = bb.emit(relax.op.nn.conv2d(data, wide, strides=2, padding=1, data_layout="NHWC",
                                         kernel_layout="HWIO", out_dtype="float32"))
        return relax.op.strided_slice(out, axes=[3], begin=[0], end=[77])

    def normalized(mod):
        return relax.transform.Normalize()(mod)

    bf16 = relax_main(params, conv, "bfloat16")
    tvm.ir.assert_structural_equal(normalized(PadConvChannels(8, pair_inputs=True)(bf16)),
                                   normalized(relax_main(params, paired, "bfloat16")))
    fp32 = relax_main(params, conv)
    for before, pair_inputs in ((fp32, True), (bf16, False)):
        after = normalized(PadConvChannels(8, pair_inputs=pair_inputs)(before))
        pads = [b.value for b in after["main"].body.blocks[0].bindings
                if isinstance(b.value, relax.Call) and b.value.op.name == "relax.nn.pad"]
        assert len(pads) == 1  # the output channels' only
