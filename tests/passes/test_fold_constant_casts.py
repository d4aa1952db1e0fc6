import numpy as np
import tvm
from tvm import relax

from tvmfuse.passes import FoldConstantCasts

from conftest import relax_main


def _module(body):
    return relax_main({"x": (2, 8)}, body, "float16")


def test_cast_of_a_constant_becomes_the_constant():
    before = _module(lambda bb, x: relax.op.minimum(
        x, bb.emit(relax.op.astype(relax.const(6.1, "float32"), "float16"))))
    after = FoldConstantCasts()(before)
    expected = _module(lambda bb, x: relax.op.minimum(x, relax.const(np.float16(6.1), "float16")))
    tvm.ir.assert_structural_equal(after, expected)


def test_casts_of_tensors_stay():
    before = _module(lambda bb, x: relax.op.astype(x, "float32"))
    tvm.ir.assert_structural_equal(FoldConstantCasts()(before), before)
