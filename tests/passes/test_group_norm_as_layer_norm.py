import numpy as np
import pytest
import torch
from torch import nn
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import GroupNormAsLayerNorm

from conftest import HOST, relax_main


class FeatureEncoderStem(nn.Module):
    """Wav2Vec2's first layer: a strided conv1d, a GroupNorm, a GELU (at awkward sizes)."""

    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.conv = nn.Conv1d(1, channels, kernel_size=10, stride=5, bias=False)
        self.norm = nn.GroupNorm(groups, channels, affine=True)
        nn.init.normal_(self.norm.weight)
        nn.init.normal_(self.norm.bias)

    def forward(self, audio):
        return nn.functional.gelu(self.norm(self.conv(audio[:, None])))


def _ops(mod) -> set[str]:
    ops = set()
    relax.analysis.post_order_visit(mod["main"], lambda e: ops.add(e.op.name) if isinstance(
        e, relax.Call) and hasattr(e.op, "name") else None)
    return ops


def test_a_3d_group_norm_becomes_a_row_layer_norm_and_the_channels_affine():
    mod = relax_main({"x": (1, 48, 203), "g": (48,), "b": (48,)},
                     lambda bb, x, g, b: relax.op.nn.group_norm(x, g, b, 12, 1, [2]))
    ops = _ops(GroupNormAsLayerNorm()(mod))
    assert "relax.nn.group_norm" not in ops
    assert {"relax.nn.layer_norm", "relax.multiply", "relax.add"} <= ops


def test_a_4d_group_norm_is_left_to_the_layout_passes():
    mod = relax_main({"x": (1, 32, 9, 9), "g": (32,), "b": (32,)},
                     lambda bb, x, g, b: relax.op.nn.group_norm(x, g, b, 8, 1, [2, 3]))
    assert "relax.nn.group_norm" in _ops(GroupNormAsLayerNorm()(mod))


@pytest.mark.parametrize("channels,groups", [(40, 40), (48, 12)])
def test_the_stem_builds_on_row_rules_and_matches_pytorch(channels, groups, tmp_path):
    """TVM's default schedule took Wav2Vec2's GroupNorm (41 GFLOP/s); as a LayerNorm it is a
    CPU row reduction with the affine and GELU as its epilogue."""
    torch.manual_seed(0)
    module, audio = FeatureEncoderStem(channels, groups).eval(), torch.randn(1, 1603)
    compiled = api.compile_model(api.import_torch(module, [audio]), api.get_target(HOST),
                                 api.BuildOptions(use_database=False))
    deployed = api.load(api.build(compiled, tmp_path / "out"))
    assert "default" not in deployed.manifest["implementations"].values()
    assert "cpu.row_reduction" in deployed.manifest["implementations"].values()
    (out,) = deployed.run([audio.numpy()])
    with torch.no_grad():
        np.testing.assert_allclose(out, module(audio).numpy(), rtol=1e-4, atol=1e-4)
