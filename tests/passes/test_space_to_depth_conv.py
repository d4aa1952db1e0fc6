"""SpaceToDepthConv (the ``space_to_depth_conv`` rule, on for CUDA): which convs become a
space-to-depth transform and a stride-1 conv, the IR it leaves, and the numbers against the
direct conv and PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import SpaceToDepthConv
from tvmfuse.passes.space_to_depth_conv import INPUT_TRANSFORM, padded_channels
from tvmfuse.schedules.cuda.matmul import NAME as MMA

CUDA = api.get_target("cuda-sm90")


def _stem_module(shape, weight, stride, padding, nchw=True, dtype="float16"):
    """``conv2d(permute(astype(x)))`` as the CUDA layout passes leave a model's stem (NHWC
    data, OHWI weight), or over an NHWC input with ``nchw`` False."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            data = bb.emit(relax.op.astype(x, dtype))
            if nchw:
                data = bb.emit(relax.op.permute_dims(data, [0, 2, 3, 1]))
            out = bb.emit(relax.op.nn.conv2d(
                data, relax.const(weight.astype(dtype)), strides=stride, padding=padding,
                data_layout="NHWC", kernel_layout="OHWI", out_dtype=dtype))
            out = bb.emit_output(relax.op.astype(out, "float32"))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, x):
    exe = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(exe, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


# the stem (7x7, stride 2, 3 channels), a 3x3 stride 2 over 3, a 5x5 stride 4 over 5 channels
# (80 channels after: 5 is whole vectors once 16 of them are stacked), odd image sizes and an
# NHWC input (no transpose to read through)
@pytest.mark.parametrize("kernel,stride,channels,size,padding,nchw", [
    (7, 2, 3, 23, 3, True),
    (3, 2, 3, 17, 1, True),
    (5, 4, 5, 21, 2, True),
    (7, 2, 3, 20, 3, False),
])
def test_strided_convs_over_few_channels_become_a_transform_and_a_stride_one_conv(
        kernel, stride, channels, size, padding, nchw):
    rng = np.random.default_rng(0)
    shape = (2, channels, size, size) if nchw else (2, size, size, channels)
    x = rng.standard_normal(shape).astype("float32")
    weight = (rng.standard_normal((8, kernel, kernel, channels)) / kernel).astype("float32")
    mod = _stem_module(shape, weight, stride, padding, nchw)
    rewritten = SpaceToDepthConv()(mod)

    script = rewritten.script(show_meta=False)
    assert script.count(f"cls.{INPUT_TRANSFORM}") == 1
    assert "R.permute_dims" not in script and script.count("R.astype") == 1  # the output's
    (conv,) = [b.value for b in rewritten["main"].body.blocks[0].bindings
               if isinstance(b.value, relax.Call) and b.value.op.name == "relax.nn.conv2d"]
    wide = padded_channels(channels, stride) * stride * stride
    assert wide % 8 == 0
    taps = -(-kernel // stride)
    assert [int(d) for d in conv.args[1].ty.shape] == [8, taps, taps, wide]
    assert [int(s) for s in conv.attrs.strides] == [1, 1]
    assert [int(p) for p in conv.attrs.padding] == [0, 0, 0, 0]

    got, want = _run(rewritten, x), _run(mod, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    # and the direct conv's value, in float32 (PyTorch)
    torch_x = torch.from_numpy(x if nchw else x.transpose(0, 3, 1, 2))
    ref = torch.nn.functional.conv2d(torch_x, torch.from_numpy(weight.transpose(0, 3, 1, 2)),
                                     stride=stride, padding=padding).numpy().transpose(0, 2, 3, 1)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.parametrize("channels,stride,dtype", [
    (8, 2, "float16"),  # whole vectors already
    (3, 1, "float16"),  # stride 1: nothing to fold
    (3, 2, "float32"),  # no tensor cores to feed
])
def test_other_convs_are_left(channels, stride, dtype):
    weight = np.ones((8, 3, 3, channels), "float32")
    mod = _stem_module((1, channels, 16, 16), weight, stride, 1, dtype=dtype)
    assert INPUT_TRANSFORM not in SpaceToDepthConv()(mod).script(show_meta=False)


class Stem(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn = torch.nn.BatchNorm2d(64)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_a_cuda_build_gives_the_stem_to_the_mma_schedule_with_its_epilogue(tmp_path):
    torch.manual_seed(0)
    model = api.import_torch(Stem().eval(), [torch.randn(4, 3, 64, 64)])
    options = api.BuildOptions(use_database=False, dtype="float16")
    _, analysis = api.analyze(model, CUDA, options, until="schedule")
    kernels = analysis.kernels
    assert sum(k.startswith(INPUT_TRANSFORM) for k in kernels) == 1
    (conv,) = [k for k in kernels if "conv2d" in k]
    assert conv.endswith("relu") and analysis.implementations[conv] == MMA
    # with the rule off, the stem is one kernel again (the transpose read in its loads)
    rules = tmp_path / "off.toml"
    rules.write_text("[cuda]\nspace_to_depth_conv = { enabled = false }\n")
    options = api.BuildOptions(use_database=False, dtype="float16", fusion_rules=rules)
    _, analysis = api.analyze(model, CUDA, options, until="schedule")
    assert not [k for k in analysis.kernels if k.startswith(INPUT_TRANSFORM)]
    assert len([k for k in analysis.kernels if "conv2d" in k]) == 1
