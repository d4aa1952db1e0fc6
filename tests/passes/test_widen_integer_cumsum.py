import numpy as np
import pytest
import torch
import tvm
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import WidenIntegerCumsum
from tvmfuse.verify import verify

from conftest import HOST, relax_main


@pytest.mark.parametrize("dtype", ["bool", "int32"])
def test_narrow_cumsum_sums_in_int64_and_what_follows_is_retyped(dtype):
    before = relax_main({"x": (1, 37)}, lambda bb, x: relax.op.equal(
        bb.emit(relax.op.cumsum(x, axis=-1)), relax.const(3, dtype)), dtype)
    after = WidenIntegerCumsum()(before)
    expected = relax_main({"x": (1, 37)}, lambda bb, x: relax.op.equal(
        bb.emit(relax.op.cumsum(bb.emit(relax.op.astype(x, "int64")), axis=-1, dtype="int64")),
        relax.const(3, dtype)), dtype)
    tvm.ir.assert_structural_equal(after, expected)


@pytest.mark.parametrize("dtype, out", [("int64", None), ("float32", None), ("bool", "int32")])
def test_wide_or_typed_cumsums_are_no_match(dtype, out):
    before = relax_main({"x": (1, 37)}, lambda bb, x: relax.op.cumsum(x, axis=-1, dtype=out),
                        dtype)
    tvm.ir.assert_structural_equal(WidenIntegerCumsum()(before), before)


class PackedSequenceIds(torch.nn.Module):
    """transformers' packed-sequence numbering: a bool cumsum, then equality of its values."""

    def forward(self, x, positions):
        starts = torch.diff(positions, prepend=positions[:, :1] - 1, dim=-1) != 1
        ids = starts.cumsum(-1)
        return x * (ids[:, :, None] == ids[:, None, :]).float()


def test_bool_cumsum_numbers_match_pytorch(tmp_path):
    """Without the pass the import sums booleans as booleans (saturating at True): the sequence
    ids 1, 2 compare equal and the mask is wrong."""
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    model = api.import_torch(PackedSequenceIds().eval(), [torch.ones(1, 7, 7), positions])
    model.example_inputs[1] = positions.numpy()
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err == 0.0
    (ref,) = model.reference(*model.example_inputs)
    assert ref.sum() == 3 * 3 + 4 * 4  # two sequences: blocks of 3 and 4
    assert not np.all(ref == ref.flat[0])
