import logging

import tvm
from tvm import relax
from tvm.s_tir import dlight as dl

from tvmfuse import api
from tvmfuse.passes import ApplyScheduleRules

from conftest import relax_main

CUDA = api.get_target("cuda-sm90").tvm_target()


class Broken(dl.gpu.Fallback):
    def apply(self, func, target, tunable):
        raise RuntimeError("There are some consumers of the cache-write stage that are not "
                           "properly inlined.")


def _relu_module():
    with CUDA:
        return relax.transform.LegalizeOps()(
            relax_main({"x": (128, 64)}, lambda bb, x: relax.op.nn.relu(x)))


def test_a_rule_that_raises_falls_through_to_the_next(caplog):
    mod = _relu_module()
    with CUDA, caplog.at_level(logging.WARNING):
        scheduled = ApplyScheduleRules([Broken(), dl.gpu.Fallback()])(mod)
    (prim,) = [f for f in scheduled.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert prim.attrs["tirx.is_scheduled"]
    assert "threadIdx.x" in prim.script()
    assert "schedule rule dlight.Broken failed on relu" in caplog.text
    tvm.compile(scheduled, target=CUDA)  # bound to threads: it builds


def test_no_rule_applies_leaves_the_kernel_alone():
    mod = _relu_module()
    with CUDA:
        after = ApplyScheduleRules([dl.gpu.Matmul()])(mod)
    tvm.ir.assert_structural_equal(after, mod)


class Refuses(dl.gpu.Fallback):
    def apply(self, func, target, tunable):
        raise AssertionError("a small reduction must not reach the general rules")


def _depthwise_module():
    with CUDA:
        return relax.transform.LegalizeOps()(relax_main(
            {"x": (1, 32, 28, 28), "w": (32, 1, 3, 3)},
            lambda bb, x, w: relax.op.nn.conv2d(x, w, padding=1, groups=32)))


def test_small_reductions_go_to_their_own_rules():
    with CUDA:
        scheduled = ApplyScheduleRules([Refuses()], small_reduction_rules=[dl.gpu.Fallback()])(
            _depthwise_module())
    (prim,) = [f for f in scheduled.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert prim.attrs["tirx.is_scheduled"]
