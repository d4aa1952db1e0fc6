import numpy as np
import torch
import tvm
from torch import nn
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import FoldLayoutGlue

from conftest import HOST, relax_main


def _module(shape, body):
    return relax_main({"x": shape}, body)


def test_mean_then_unit_transpose_then_reshape_becomes_one_mean():
    def before(bb, x):
        y = bb.emit(relax.op.mean(x, [1, 2], keepdims=True))
        y = bb.emit(relax.op.permute_dims(y, [0, 3, 1, 2]))
        return relax.op.reshape(y, [1, 32])

    def after(bb, x):
        return relax.op.mean(x, [1, 2], keepdims=False)

    result = FoldLayoutGlue()(_module((1, 7, 7, 32), before))
    tvm.ir.assert_structural_equal(result, _module((1, 7, 7, 32), after))


def test_transposes_that_undo_each_other_vanish_and_others_compose():
    def undone(bb, x):
        y = bb.emit(relax.op.permute_dims(x, [0, 3, 1, 2]))
        return relax.op.add(relax.op.permute_dims(y, [0, 2, 3, 1]), x)

    def identity(bb, x):
        return relax.op.add(x, x)

    result = FoldLayoutGlue()(_module((1, 7, 5, 32), undone))
    tvm.ir.assert_structural_equal(result, _module((1, 7, 5, 32), identity))

    def twice(bb, x):
        y = bb.emit(relax.op.permute_dims(x, [0, 3, 1, 2]))  # [1, 32, 7, 5]
        return relax.op.permute_dims(y, [0, 1, 3, 2])         # [1, 32, 5, 7]

    def once(bb, x):
        return relax.op.permute_dims(x, [0, 3, 2, 1])

    result = FoldLayoutGlue()(_module((1, 7, 5, 32), twice))
    tvm.ir.assert_structural_equal(result, _module((1, 7, 5, 32), once))


class ChannelsLast(nn.Module):
    """A depthwise conv between NHWC tensors (permuted to NCHW for PyTorch's conv)."""

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)

    def forward(self, x):
        return self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


def test_nhwc_model_meets_the_layout_change_without_copies(tmp_path):
    """The model's NHWC -> NCHW permute and the layout change's NCHW -> NHWC one cancel: one
    kernel, the depthwise conv, reading its input as given."""
    torch.manual_seed(0)
    module, x = ChannelsLast(48).eval(), torch.randn(1, 9, 11, 48)
    compiled = api.compile_model(api.import_torch(module, [x]), api.get_target(HOST),
                                 api.BuildOptions(use_database=False))
    assert len(compiled.analysis.kernels) == 1, compiled.analysis.kernels
    assert not any("transpose" in k or "permute" in k for k in compiled.analysis.kernels)
    (out,) = api.load(api.build(compiled, tmp_path / "out")).run([x.numpy()])
    with torch.no_grad():
        np.testing.assert_allclose(out, module(x).numpy(), rtol=1e-4, atol=1e-5)


def test_a_transpose_that_moves_data_stays():
    def body(bb, x):
        y = bb.emit(relax.op.permute_dims(x, [0, 3, 1, 2]))
        return relax.op.reshape(y, [1, 32 * 49])

    before = _module((1, 7, 7, 32), body)
    tvm.ir.assert_structural_equal(FoldLayoutGlue()(before), before)


def test_a_mean_used_twice_keeps_its_dims():
    def body(bb, x):
        m = bb.emit(relax.op.mean(x, [1, 2], keepdims=True))
        flat = bb.emit(relax.op.reshape(m, [1, 32]))
        return relax.Tuple([flat, m])

    before = _module((1, 7, 7, 32), body)
    tvm.ir.assert_structural_equal(FoldLayoutGlue()(before), before)


class Head(nn.Module):
    """A classifier head as ResNet has it: conv, global average pool, flatten, linear."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 32, 3, padding=1), nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.conv(x), 1), 1))


def test_head_has_no_transpose_kernel_and_matches_pytorch(tmp_path):
    torch.manual_seed(0)
    module, x = Head().eval(), torch.randn(1, 3, 8, 8)
    compiled = api.compile_model(api.import_torch(module, [x]), api.get_target(HOST),
                                 api.BuildOptions(use_database=False))
    # the input's NHWC transpose joins the conv; the pooled [1, 1, 1, 32] goes straight to the
    # linear layer: conv, mean, linear
    assert len(compiled.analysis.kernels) == 3
    assert not any("transpose" in k or "reshape" in k for k in compiled.analysis.kernels)
    (out,) = api.load(api.build(compiled, tmp_path / "out")).run([x.numpy()])
    with torch.no_grad():
        np.testing.assert_allclose(out, module(x).numpy(), rtol=1e-4, atol=1e-5)


class DecodeHead(nn.Module):
    """SegFormer's decode head at an awkward size: two token maps ``[1, H*W, C]`` (7x5 and 4x3)
    made NCHW, upsampled to 7x5, concatenated over channels and mixed by a 1x1 conv; then a
    depthwise conv between token maps, as its Mix-FFN has one."""

    def __init__(self, channels=24):
        super().__init__()
        self.mix = nn.Conv2d(2 * channels, channels, 1)
        self.depthwise = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)

    def forward(self, a, b):
        maps = [t.transpose(1, 2).reshape(1, -1, h, w) for t, (h, w) in ((a, (7, 5)), (b, (4, 3)))]
        maps = [nn.functional.interpolate(m, size=(7, 5), mode="bilinear", align_corners=False)
                for m in maps]
        mixed = torch.relu(self.mix(torch.cat(maps, dim=1)))  # [1, C, 7, 5]
        tokens = mixed.flatten(2).transpose(1, 2)  # [1, 35, C]
        out = self.depthwise(tokens.transpose(1, 2).reshape(1, -1, 7, 5))
        return out.flatten(2).transpose(1, 2)


def test_an_upsampled_decode_head_concatenates_and_convolves_in_nhwc(tmp_path):
    """The convs' NHWC permute moves up through the concatenation and the resizes (which resize
    in NHWC) and folds with each token map's transpose and reshape: no kernel transposes, and the
    1x1 conv's and the depthwise conv's kernels read their inputs as given."""
    torch.manual_seed(0)
    module = DecodeHead().eval()
    a, b = torch.randn(1, 35, 24), torch.randn(1, 12, 24)
    model = api.import_torch(module, [a, b])
    mod, _ = api.analyze(model, api.get_target(HOST), api.BuildOptions(use_database=False),
                         until="canonicalize")
    resizes = [c for c in _calls(mod["main"]) if c.op.name == "relax.image.resize2d"]
    assert [str(c.attrs.layout) for c in resizes] == ["NHWC", "NHWC"]
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions(use_database=False))
    assert not any("transpose" in k or "permute" in k for k in compiled.analysis.kernels), \
        compiled.analysis.kernels
    (out,) = api.load(api.build(compiled, tmp_path / "out")).run([a.numpy(), b.numpy()])
    with torch.no_grad():
        np.testing.assert_allclose(out, module(a, b).numpy(), rtol=1e-4, atol=1e-5)


def _calls(func):
    found = []
    relax.analysis.post_order_visit(func, lambda e: found.append(e) if isinstance(
        e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return found
