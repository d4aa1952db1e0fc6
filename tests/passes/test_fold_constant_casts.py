import numpy as np
import tvm
from tvm import relax

from tvmfuse.passes import FoldConstantCasts


def _module(body):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def test_cast_of_a_constant_becomes_the_constant():
    before = _module(lambda bb, x: relax.op.minimum(
        x, bb.emit(relax.op.astype(relax.const(6.1, "float32"), "float16"))))
    after = FoldConstantCasts()(before)
    expected = _module(lambda bb, x: relax.op.minimum(x, relax.const(np.float16(6.1), "float16")))
    tvm.ir.assert_structural_equal(after, expected)


def test_casts_of_tensors_stay():
    before = _module(lambda bb, x: relax.op.astype(x, "float32"))
    tvm.ir.assert_structural_equal(FoldConstantCasts()(before), before)
