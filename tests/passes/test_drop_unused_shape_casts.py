import numpy as np
import torch
from torch import nn

from tvmfuse import api
from tvmfuse.passes import DropUnusedShapeCasts

from conftest import HOST


class CheckedLengths(nn.Module):
    """FlauBERT's forward: the longest sequence read with ``.item()`` for a check that the
    export drops, leaving a ``match_cast`` of the read's shape that nothing uses."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 24)

    def forward(self, ids, mask):
        lengths = (ids != 2).sum(dim=1)
        torch._check(lengths.max().item() <= ids.shape[1])
        return self.embed(ids) * mask.unsqueeze(-1).float()


def _imported():
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (1, 7))
    mask = torch.ones(1, 7, dtype=torch.long)
    return CheckedLengths().eval(), [ids, mask]


def test_the_unread_item_is_dropped_and_the_rest_kept():
    module, inputs = _imported()
    mod = api.import_torch(module, inputs).mod
    assert "match_cast" in mod.script() and "tensor_to_shape" in mod.script()
    after = DropUnusedShapeCasts()(mod).script()
    assert "match_cast" not in after and "tensor_to_shape" not in after
    assert "R.take" in after  # the embedding is untouched


def test_an_fp16_build_of_a_checked_read_compiles_and_matches_pytorch(tmp_path):
    """ToMixedPrecision stopped on the unread shape ("Expected TensorType, but got
    R.Shape(ndim=1)"): FlauBERT built in float32 and not in float16."""
    module, inputs = _imported()
    compiled = api.compile_model(api.import_torch(module, inputs), api.get_target(HOST),
                                 api.BuildOptions(use_database=False, dtype="float16"))
    (out,) = api.load(api.build(compiled, tmp_path / "out")).run([t.numpy() for t in inputs])
    with torch.no_grad():
        np.testing.assert_allclose(out, module(*inputs).numpy(), rtol=1e-2, atol=1e-2)
