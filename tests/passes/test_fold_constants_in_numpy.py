import numpy as np
import pytest
import tvm
from tvm import relax

from tvmfuse.passes import FoldConstantsInNumPy, FoldRemainingConstants

RNG = np.random.default_rng(0)
A = RNG.standard_normal((3, 5, 7)).astype("float32")
B = RNG.standard_normal((1, 5, 1)).astype("float32")
POSITIVE = np.abs(A) + 0.5
INTS = RNG.integers(-9, 9, (3, 5, 7)).astype("int64")

#: op -> its call over constants, at shapes no vector width divides.
CASES = {
    "add": lambda c: relax.op.add(c(A), c(B)),
    "subtract": lambda c: relax.op.subtract(c(B), c(A)),
    "multiply": lambda c: relax.op.multiply(c(A), c(B)),
    "divide": lambda c: relax.op.divide(c(A), c(POSITIVE)),
    "maximum": lambda c: relax.op.maximum(c(A), c(B)),
    "minimum": lambda c: relax.op.minimum(c(INTS), c(INTS[::-1].copy())),
    "sqrt": lambda c: relax.op.sqrt(c(POSITIVE)),
    "rsqrt": lambda c: relax.op.rsqrt(c(POSITIVE)),
    "negative": lambda c: relax.op.negative(c(A)),
    "abs": lambda c: relax.op.abs(c(A)),
    "reshape": lambda c: relax.op.reshape(c(A), (7, 15)),
    "expand_dims": lambda c: relax.op.expand_dims(c(A), 1),
    "squeeze": lambda c: relax.op.squeeze(c(B), [0, 2]),
    "flatten": lambda c: relax.op.flatten(c(A)),
    "permute_dims": lambda c: relax.op.permute_dims(c(A), [2, 0, 1]),
    "permute_dims reversed": lambda c: relax.op.permute_dims(c(A)),
    "astype": lambda c: relax.op.astype(c(A * 4), "int32"),
    "concat": lambda c: relax.op.concat([c(A), c(A * 2)], axis=1),
    "pad": lambda c: relax.op.nn.pad(c(A), [0, 0, 1, 2, 3, 0], pad_value=1.5),
    # comparisons and masks as numbers (the chain's multiply takes no booleans)
    "greater_equal": lambda c: relax.op.astype(relax.op.greater_equal(c(A), c(B)), "float32"),
    "less": lambda c: relax.op.astype(relax.op.less(c(INTS), c(INTS[::-1].copy())), "int32"),
    "bitwise_and": lambda c: relax.op.astype(relax.op.bitwise_and(c(INTS > 0), c(INTS < 5)),
                                             "int64"),
    "broadcast_to": lambda c: relax.op.broadcast_to(c(B), (4, 5, 7)),
    "strided_slice": lambda c: relax.op.strided_slice(c(A), [1, 2], [1, -6], [99, 7], [2, 3]),
    # a position-id mask's gathers: indices in range
    "take": lambda c: relax.op.take(c(A), c(np.array([[4, 0], [2, 2]], "int64")), axis=1),
    "gather_elements": lambda c: relax.op.gather_elements(c(A), c(np.abs(INTS) % 5), axis=1),
}


def _module(case):
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            first = bb.emit(case(relax.const))
            out = bb.emit_output(relax.op.multiply(first, first))  # a chain folds whole
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("name", list(CASES))
def test_folds_to_the_constant_tvm_computes(name):
    before = _module(CASES[name])
    after = FoldConstantsInNumPy()(before)
    body = after["main"].body
    assert not [b for block in body.blocks for b in block.bindings], after.script()
    assert isinstance(body.body, tvm.ir.expr.Constant)
    expected = relax.transform.FoldConstant()(before)["main"].body.body.value.numpy()
    got = body.body.value.numpy()
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)


def test_calls_over_non_constants_and_other_ops_are_left():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 5, 7), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            scaled = bb.emit(relax.op.multiply(x, relax.const(B)))
            bb.emit(relax.op.exp(relax.const(A)))  # not NumPy's to compute: TVM's FoldConstant
            # indices out of range: what TVM reads depends on the mode
            bb.emit(relax.op.take(relax.const(A), relax.const(np.array([-1], "int64")), axis=0))
            bb.emit(relax.op.strided_slice(relax.const(A), [0], [2], [0], [-1]))  # a step < 0
            # operands of two dtypes (NumPy promotes them otherwise), booleans' arithmetic,
            # and indices narrower than the data off the gathered axis
            bb.emit(relax.op.equal(relax.const(INTS), relax.const(A)))
            bb.emit(relax.op.subtract(relax.const(INTS > 0), relax.const(INTS < 5)))
            bb.emit(relax.op.gather_elements(relax.const(A), relax.const(
                np.zeros((3, 2, 7), "int64")), axis=1))
            half = bb.emit(relax.op.astype(relax.const(A), "float16"))
            out = bb.emit_output(relax.op.add(scaled, relax.op.astype(half, "float32")))
        bb.emit_func_output(out)
    before = bb.get()
    tvm.ir.assert_structural_equal(FoldConstantsInNumPy()(before), relax.transform
                                   .DeadCodeElimination()(before))


def test_tvm_folds_what_is_left_and_nothing_runs_where_nothing_is_left():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 5, 7), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, relax.op.exp(relax.const(A))))
        bb.emit_func_output(out)
    before = bb.get()
    folded = FoldRemainingConstants()(before)
    tvm.ir.assert_structural_equal(folded, relax.transform.FoldConstant()(before))
    assert not folded.same_as(before)  # exp over a constant: TVM's to compute
    left = FoldRemainingConstants()(folded)  # only x + constant: nothing to fold
    tvm.ir.assert_structural_equal(relax.transform.FoldConstant()(folded), left)
