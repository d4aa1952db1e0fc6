import numpy as np
import pytest
import torch
import tvm
from tvm import relax, tirx

from tvmfuse import api
from tvmfuse.passes import SimplifyBoundedShapes
from tvmfuse.verify import verify

from conftest import HOST


def _positions(bound: int | None, axis: int = 1, inbound: bool = False):
    """``ids + positions[:, :seq]`` as transformers adds learned positions, ``seq`` symbolic
    and at most ``bound`` (None: unbounded); positions are a 512-long table."""
    seq = tirx.Var("seq", "int64")
    ids = relax.Var("ids", relax.TensorType((1, seq), "int64"))
    table = relax.const(np.arange(512, dtype="int64")[None], "int64")
    bb = relax.BlockBuilder()
    attrs = {"tir_var_upper_bound": {"seq": bound}, "tir_var_lower_bound": {"seq": 1}}
    with bb.function("main", [ids], attrs=attrs if bound else None):
        with bb.dataflow():
            sliced = bb.emit(relax.op.strided_slice(table, [axis], [0], [seq],
                                                    assume_inbound=inbound))
            out = bb.emit_output(relax.op.add(ids, sliced))
        bb.emit_func_output(out)
    return bb.get(), seq


def test_a_slice_the_bound_proves_in_bounds_keeps_the_symbolic_length():
    before, _ = _positions(128, axis=-1)
    # as imported: the slice is min(seq, 512) long and the sum has no shape at all
    assert before["main"].ret_ty.shape is None
    after = SimplifyBoundedShapes()(before)
    expected, _ = _positions(128, axis=1, inbound=True)  # axis -1 made non-negative
    tvm.ir.assert_structural_equal(after, expected)
    assert len(after["main"].ret_ty.shape.values) == 2  # (1, seq)


@pytest.mark.parametrize("bound", [None, 600])
def test_unbounded_or_out_of_bounds_slices_are_no_match(bound):
    before, _ = _positions(bound)
    tvm.ir.assert_structural_equal(SimplifyBoundedShapes()(before), before)


class Positions(torch.nn.Module):
    """Token embeddings plus learned positions sliced to the sequence, as BERT-likes do."""

    def __init__(self):
        super().__init__()
        self.tokens, self.positions = torch.nn.Embedding(100, 16), torch.nn.Embedding(512, 16)
        self.register_buffer("ids", torch.arange(512)[None])

    def forward(self, input_ids):
        return self.tokens(input_ids) + self.positions(self.ids[:, :input_ids.shape[1]])


def test_numbers_against_pytorch_at_several_lengths(tmp_path):
    ids = torch.randint(0, 100, (1, 24))
    model = api.import_torch(Positions(), [ids], dynamic=["seq"], max_seq=64)
    assert model.bounds == {"seq": 64}
    assert model.outputs[0].shape == (1, "seq", 16)  # not an unknown shape
    target = api.get_target(HOST)
    deployed = api.load(api.build(api.compile_model(
        model, target, api.BuildOptions(use_database=False)), tmp_path / "out"))
    checks = verify(deployed, model)
    assert [c.at for c in checks] == ["seq 24", "seq 19", "seq 64"]
    assert max(c.rel_err for c in checks) < 1e-6
