import numpy as np
import pytest
import torch
import tvm
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import StackAsConcat
from tvmfuse.verify import verify

from conftest import relax_main

SHAPE = (1, 8, 4, 4)


def _module(body):
    return relax_main({"x": SHAPE, "y": SHAPE}, body)


@pytest.mark.parametrize(("reduce", "fold"), [(relax.op.min, relax.op.minimum),
                                              (relax.op.max, relax.op.maximum),
                                              (relax.op.sum, relax.op.add)])
def test_a_reduction_over_the_stacked_axis_becomes_elementwise(reduce, fold):
    """The ONNX importer's variadic Min/Max/Sum: a stack reduced over its new axis."""
    before = _module(lambda bb, x, y: reduce(
        bb.emit(relax.op.stack(relax.Tuple([x, y]), axis=0)), axis=[0]))
    tvm.ir.assert_structural_equal(StackAsConcat()(before), _module(lambda bb, x, y: fold(x, y)))
    kept = _module(lambda bb, x, y: reduce(
        bb.emit(relax.op.stack(relax.Tuple([x, y]), axis=-1)), axis=[-1], keepdims=True))
    tvm.ir.assert_structural_equal(StackAsConcat()(kept), _module(
        lambda bb, x, y: relax.op.expand_dims(bb.emit(fold(x, y)), 4)))


def test_a_stack_becomes_a_concat_of_expanded_inputs():
    before = _module(lambda bb, x, y: relax.op.stack(relax.Tuple([x, y]), axis=2))
    expected = _module(lambda bb, x, y: relax.op.concat(
        [bb.emit(relax.op.expand_dims(x, 2)), bb.emit(relax.op.expand_dims(y, 2))], axis=2))
    tvm.ir.assert_structural_equal(StackAsConcat()(before), expected)
    # a reduction over another axis keeps its stack, as a concat
    other = _module(lambda bb, x, y: relax.op.max(
        bb.emit(relax.op.stack(relax.Tuple([x, y]), axis=0)), axis=[1]))
    assert "concat" in StackAsConcat()(other).script()


class _ConvThenStacks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        both = torch.stack([y, -0.5 * y], dim=2).amax(dim=2)  # a reduction over the new axis
        return torch.stack([both, y], dim=-1).flatten(-2).sum(dim=1)  # a stack kept


def test_stacks_beside_nhwc_convs_build_and_match_pytorch(tmp_path):
    """TVM's layout rule for stack failed ConvertLayout ("Invalid SLayout: can't find S")."""
    torch.manual_seed(0)
    model = api.import_torch(_ConvThenStacks().eval(), (torch.randn(1, 3, 9, 7),))
    compiled = api.compile_model(model, api.get_target(), api.BuildOptions(use_database=False))
    api.build(compiled, tmp_path / "b")
    assert max(c.rel_err for c in verify(api.load(tmp_path / "b"), model)) < 1e-5


def test_onnx_min_of_two_tensors_builds_and_matches_onnxruntime(tmp_path):
    """ONNX's Min imports as a stack reduced by min; before this pass no conv model with one
    built (Apertus's xIELU)."""
    class Min(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)

        def forward(self, x):
            y = self.conv(x)
            return torch.minimum(y, y * y)

    torch.manual_seed(0)
    with torch.no_grad():
        torch.onnx.export(Min().eval(), (torch.randn(1, 3, 8, 8),), str(tmp_path / "m.onnx"),
                          dynamo=False, input_names=["x"])
    model = api.import_model(str(tmp_path / "m.onnx"))
    assert "R.stack" in model.mod["main"].script()
    compiled = api.compile_model(model, api.get_target(), api.BuildOptions(use_database=False))
    api.build(compiled, tmp_path / "b")
    checks = verify(api.load(tmp_path / "b"), model)
    assert max(c.rel_err for c in checks) < 1e-5
    assert np.isfinite(checks[0].rel_err)
