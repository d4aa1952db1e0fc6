import numpy as np
import torch
import tvm
from torch import nn
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import SliceScatterAsConcat

from conftest import HOST, relax_main


class PartialRotary(nn.Module):
    """What multi-head latent attention does to a head (DeepSeek-V2, MiniCPM3): a function of
    part of a projection's last axis written back into it (exported as ``slice_scatter``)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(40, 40)

    def forward(self, x):
        y = self.proj(x)
        y[..., 8:24] = torch.sin(y[..., 8:24]) * 2.0
        return y * 1.5


def test_a_slice_scatter_becomes_a_concatenation_of_slices():
    def before(bb, x, src):
        return relax.op.slice_scatter(x, src, 8, 24, 1, axis=2)

    def after(bb, x, src):
        head = bb.emit(relax.op.strided_slice(x, [2], [0], [8]))
        tail = bb.emit(relax.op.strided_slice(x, [2], [24], [40]))
        return relax.op.concat([head, src, tail], axis=2)

    shapes = {"x": (2, 3, 40), "src": (2, 3, 16)}
    result = SliceScatterAsConcat()(relax_main(shapes, before))
    expected = relax_main(shapes, after)
    tvm.ir.assert_structural_equal(relax.transform.Normalize()(result),
                                   relax.transform.Normalize()(expected))


def test_an_fp16_build_of_a_partial_rotary_compiles_and_matches_pytorch(tmp_path):
    """ToMixedPrecision failed on the scatter's integer bounds ("Expected TensorType, but got
    T.int64"): the fp16 build stopped in its first phase."""
    torch.manual_seed(0)
    module, x = PartialRotary().eval(), torch.randn(1, 5, 40)
    compiled = api.compile_model(api.import_torch(module, [x]), api.get_target(HOST),
                                 api.BuildOptions(use_database=False, dtype="float16"))
    (out,) = api.load(api.build(compiled, tmp_path / "out")).run([x.numpy()])
    with torch.no_grad():
        np.testing.assert_allclose(out, module(x).numpy(), rtol=1e-2, atol=1e-2)
