import numpy as np
import pytest
import tvm
from tvm import relax

from tvmfuse.passes import FoldMatmulReshape

from conftest import relax_main

rng = np.random.default_rng(0)
W = rng.standard_normal((8, 4)).astype("float32")
B = rng.standard_normal(4).astype("float32")


def _module(body, shape=(2, 16, 8)):
    return relax_main({"x": shape}, body)


def _linear_2d(bias: bool, out_shape=(2, 16, 4)):
    def body(bb, x):
        flat = bb.emit(relax.op.reshape(x, (32, 8)))
        y = bb.emit(relax.op.matmul(flat, relax.const(W)))
        if bias:
            y = bb.emit(relax.op.add(relax.const(B), y))
        return relax.op.reshape(y, out_shape)

    return _module(body)


def _linear_3d(bias: bool):
    def body(bb, x):
        y = relax.op.matmul(x, relax.const(W))
        if not bias:
            return y
        return relax.op.add(bb.emit(y), relax.const(B))

    return _module(body)


@pytest.mark.parametrize("bias", [True, False])
def test_reshape_matmul_reshape_becomes_one_batched_matmul(bias):
    tvm.ir.assert_structural_equal(FoldMatmulReshape()(_linear_2d(bias)), _linear_3d(bias))


def test_a_reshape_that_regroups_rows_is_kept():
    before = _linear_2d(True, out_shape=(4, 8, 4))  # not x's leading dims: a real regrouping
    tvm.ir.assert_structural_equal(FoldMatmulReshape()(before), before)


def test_rewrite_keeps_the_numbers():
    x = rng.standard_normal((2, 16, 8)).astype("float32")
    target = tvm.target.Target({"kind": "llvm"})

    def run(mod):
        vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
        return vm["main"](tvm.runtime.tensor(x)).numpy()

    before = _linear_2d(True)
    np.testing.assert_allclose(run(FoldMatmulReshape()(before)), x @ W + B, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run(before), x @ W + B, rtol=1e-5, atol=1e-5)
