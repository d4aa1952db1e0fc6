import pytest
import torch
import tvm
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import Conv1DAsConv2D
from tvmfuse.verify import verify

from conftest import HOST, relax_main


def test_conv1d_becomes_a_conv2d_over_height_one():
    params = {"x": (1, 8, 30), "w": (16, 8, 3)}
    before = relax_main(params, lambda bb, x, w: relax.op.nn.conv1d(
        x, w, strides=2, padding=1))
    expected = relax_main(params, lambda bb, x, w: relax.op.reshape(
        bb.emit(relax.op.nn.conv2d(bb.emit(relax.op.reshape(x, [1, 8, 1, 30])),
                                   bb.emit(relax.op.reshape(w, [16, 8, 1, 3])),
                                   strides=(1, 2), padding=(0, 1, 0, 1))), [1, 16, 15]))
    after = Conv1DAsConv2D()(before)
    tvm.ir.assert_structural_equal(relax.transform.Normalize()(after),
                                   relax.transform.Normalize()(expected))


def test_other_layouts_are_no_match():
    params = {"x": (1, 30, 8), "w": (16, 8, 3)}
    before = relax_main(params, lambda bb, x, w: relax.op.nn.conv1d(
        x, w, data_layout="NWC", kernel_layout="OIW", out_layout="NWC"))
    tvm.ir.assert_structural_equal(Conv1DAsConv2D()(before), before)


class AudioStem(torch.nn.Module):
    """Whisper's: two Conv1d with GELU, the second strided, over 61 frames (odd, prime)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv1d(20, 48, 3, padding=1)
        self.conv2 = torch.nn.Conv1d(48, 48, 3, stride=2, padding=1)

    def forward(self, x):
        x = torch.nn.functional.gelu(self.conv1(x))
        return torch.nn.functional.gelu(self.conv2(x)).transpose(1, 2)


@pytest.mark.parametrize("frames", [61, 64])
def test_audio_stem_takes_the_conv2d_schedule_and_matches_pytorch(tmp_path, frames):
    torch.manual_seed(0)
    model = api.import_torch(AudioStem().eval(), [torch.randn(1, 20, frames)])
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    assert list(compiled.analysis.implementations.values()).count("cpu.conv2d") == 2
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-5
