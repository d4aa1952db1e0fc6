import numpy as np
import pytest
import torch
import tvm
from tvm import relax

from tvmfuse.passes import FoldBatchNorm

from conftest import relax_main

rng = np.random.default_rng(0)
W = rng.standard_normal((4, 3, 3, 3)).astype("float32")
B = rng.standard_normal(4).astype("float32")
GAMMA, BETA, MEAN = (rng.standard_normal(4).astype("float32") for _ in range(3))
VAR = rng.uniform(0.5, 1.5, 4).astype("float32")
EPS = 1e-5


def _module(body):
    return relax_main({"x": (1, 3, 8, 8)}, body)


def _conv_bn(with_bias: bool, axis: int = 1, weight=None):
    def body(bb, x):
        y = bb.emit(relax.op.nn.conv2d(x, weight if weight is not None else relax.const(W),
                                       padding=1))
        if with_bias:
            y = bb.emit(relax.op.add(y, relax.const(B.reshape(1, 4, 1, 1))))
        consts = [relax.const(a) for a in (GAMMA, BETA, MEAN, VAR)]
        bn = bb.emit(relax.op.nn.batch_norm(y, *consts, axis=axis, epsilon=EPS))
        return relax.TupleGetItem(bn, 0)

    return _module(body)


def _folded(bias: np.ndarray):
    scale = GAMMA / np.sqrt(VAR + EPS)
    shift = BETA + (bias - MEAN) * scale

    def body(bb, x):
        y = bb.emit(relax.op.nn.conv2d(x, relax.const(W * scale.reshape(-1, 1, 1, 1)), padding=1))
        return relax.op.add(y, relax.const(shift.reshape(1, 4, 1, 1).astype("float32")))

    return _module(body)


@pytest.mark.parametrize("with_bias", [False, True])
def test_conv_bn_becomes_conv_with_folded_weight_and_bias(with_bias):
    after = FoldBatchNorm()(_conv_bn(with_bias))
    expected = _folded(B if with_bias else np.float32(0.0))
    tvm.ir.assert_structural_equal(after, expected)


def _bn_after(conv, data_shape, axis, extra_params=()):
    bb = relax.BlockBuilder()
    data = relax.Var("x", relax.TensorType(data_shape, "float32"))
    with bb.function("main", [data, *extra_params]):
        with bb.dataflow():
            y = bb.emit(conv(data))
            consts = [relax.const(a) for a in (GAMMA, BETA, MEAN, VAR)]
            bn = bb.emit(relax.op.nn.batch_norm(y, *consts, axis=axis, epsilon=EPS))
            out = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(out)
    return bb.get()


def test_nhwc_conv_is_not_folded():
    ohwi = relax.const(W.transpose(0, 2, 3, 1).copy())
    before = _bn_after(
        lambda x: relax.op.nn.conv2d(x, ohwi, padding=1, data_layout="NHWC", kernel_layout="OHWI"),
        (1, 8, 8, 3), axis=3,
    )
    tvm.ir.assert_structural_equal(FoldBatchNorm()(before), before)


def test_conv_with_a_weight_parameter_is_not_folded():
    weight = relax.Var("w", relax.TensorType((4, 3, 3, 3), "float32"))
    before = _bn_after(lambda x: relax.op.nn.conv2d(x, weight, padding=1), (1, 3, 8, 8), axis=1,
                       extra_params=[weight])
    tvm.ir.assert_structural_equal(FoldBatchNorm()(before), before)


def test_folded_conv_matches_pytorch():
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    bn = torch.nn.BatchNorm2d(4, eps=EPS).eval()
    with torch.no_grad():
        conv.weight.copy_(torch.from_numpy(W))
        conv.bias.copy_(torch.from_numpy(B))
        for p, v in ((bn.weight, GAMMA), (bn.bias, BETA), (bn.running_mean, MEAN),
                     (bn.running_var, VAR)):
            p.copy_(torch.from_numpy(v))
    x = rng.standard_normal((1, 3, 8, 8)).astype("float32")
    with torch.no_grad():
        ref = bn(conv(torch.from_numpy(x))).numpy()
    mod = FoldBatchNorm()(_conv_bn(True))
    assert "batch_norm" not in mod.script()
    vm = relax.VirtualMachine(tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"})),
                              tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
