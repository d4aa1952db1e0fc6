import tvm
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import DecomposeClip

from conftest import relax_main


def _module(body):
    return relax_main({"x": (1, 8, 4, 4)}, body)


def test_clip_becomes_maximum_then_minimum():
    before = _module(lambda bb, x: relax.op.clip(x, 0.0, 6.0))
    after = DecomposeClip()(before)
    expected = _module(lambda bb, x: relax.op.minimum(
        bb.emit(relax.op.maximum(x, relax.const(0.0, "float32"))), relax.const(6.0, "float32")))
    tvm.ir.assert_structural_equal(after, expected)


def test_integer_clip_drops_its_infinite_bound():
    """torch.clamp(ids, min=1) imports as clip(ids, 1, inf): TVM cannot cast inf to int64."""
    def module(body):
        return relax_main({"x": (2, 9)}, body, dtype="int64")

    before = module(lambda bb, x: relax.op.clip(x, 1, float("inf")))
    expected = module(lambda bb, x: relax.op.maximum(x, relax.const(1, "int64")))
    tvm.ir.assert_structural_equal(DecomposeClip()(before), expected)
    both = module(lambda bb, x: relax.op.clip(x, -3, 5))
    tvm.ir.assert_structural_equal(DecomposeClip()(both), module(lambda bb, x: relax.op.minimum(
        bb.emit(relax.op.maximum(x, relax.const(-3, "int64"))), relax.const(5, "int64"))))


def test_no_clip_no_change():
    before = _module(lambda bb, x: relax.op.nn.relu(x))
    tvm.ir.assert_structural_equal(DecomposeClip()(before), before)


def test_relu6_survives_the_nhwc_layout_inside_the_conv_kernel(build_tiny):
    """MobileNetV2's ReLU6 after the NHWC conversion: fused into the conv, numbers unchanged."""
    model, folder = build_tiny("tiny-mobilenet")
    manifest = api.load(folder).manifest
    rules = {g["rule"] for g in manifest["fusion_groups"]}
    assert "tvmfuse.conv_epilogue.bias_minmax" in rules
    # no transposes around the ReLU6s: the only one is the input's, the first conv's prologue
    transposes = [g["ops"] for g in manifest["fusion_groups"] if "transpose" in g["ops"]]
    assert transposes == [["transpose", "conv2d", "add", "maximum", "minimum"]]
    from tvmfuse.verify import verify

    checks = verify(api.load(folder), model)
    assert max(c.rel_err for c in checks) < 1e-4
