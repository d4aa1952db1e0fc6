import numpy as np
import pytest
import tvm
from tvm import relax

from tvmfuse.passes import MergeParallelMatmul

from conftest import relax_main

rng = np.random.default_rng(0)
WQ, WK, WV = (rng.standard_normal((8, n)).astype("float32") for n in (4, 4, 6))
BQ, BK, BV = (rng.standard_normal(w.shape[1]).astype("float32") for w in (WQ, WK, WV))


def _module(body):
    return relax_main({"x": (2, 16, 8)}, lambda bb, x: relax.Tuple(body(bb, x)))


def _qkv(bias: bool):
    def body(bb, x):
        outs = []
        for w, b in ((WQ, BQ), (WK, BK), (WV, BV)):
            y = bb.emit(relax.op.matmul(x, relax.const(w)))
            outs.append(bb.emit(relax.op.add(y, relax.const(b))) if bias else y)
        return [bb.emit(relax.op.nn.relu(o)) for o in outs]

    return _module(body)


def _merged(bias: bool):
    def body(bb, x):
        y = bb.emit(relax.op.matmul(x, relax.const(np.concatenate([WQ, WK, WV], axis=1))))
        if bias:
            y = bb.emit(relax.op.add(y, relax.const(np.concatenate([BQ, BK, BV]))))
        parts = [bb.emit(relax.op.strided_slice(y, [2], [lo], [hi]))
                 for lo, hi in ((0, 4), (4, 8), (8, 14))]
        return [bb.emit(relax.op.nn.relu(p)) for p in parts]

    return _module(body)


@pytest.mark.parametrize("bias", [True, False])
def test_parallel_matmuls_become_one_gemm_and_slices(bias):
    tvm.ir.assert_structural_equal(MergeParallelMatmul()(_qkv(bias)), _merged(bias))


def test_matmuls_on_different_inputs_are_not_merged():
    def body(bb, x):
        y = bb.emit(relax.op.nn.relu(x))
        return [bb.emit(relax.op.matmul(x, relax.const(WQ))),
                bb.emit(relax.op.matmul(y, relax.const(WK)))]

    before = _module(body)
    tvm.ir.assert_structural_equal(MergeParallelMatmul()(before), before)


def test_max_branches_limits_the_merge():
    after = MergeParallelMatmul(max_branches=2)(_qkv(True))
    matmuls = [line for line in after.script().splitlines() if "R.matmul" in line]
    assert len(matmuls) == 2  # Q and K merged, V on its own


def test_merge_keeps_the_numbers():
    x = rng.standard_normal((2, 16, 8)).astype("float32")
    target = tvm.target.Target({"kind": "llvm"})

    def run(mod):
        vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
        return [t.numpy() for t in vm["main"](tvm.runtime.tensor(x))]

    for got, w, b in zip(run(MergeParallelMatmul()(_qkv(True))), (WQ, WK, WV), (BQ, BK, BV)):
        np.testing.assert_allclose(got, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
