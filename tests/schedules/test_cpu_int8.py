"""int8 GEMMs and convs on AVX-512 VNNI (schedules/cpu/int8_dot.py): the register tile's inner
16 lanes x 4 reduction steps are one ``vpdpbusd``, the weights packed in quads; where the core
lacks the instruction or the reduction is not whole quads, the scalar tile. The int32 sums are
exact: compared with integer arithmetic, scaled as the int8 build's epilogue scales them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import tvm
from tvm import relax, tirx

from tvmfuse.names import LAYOUT_REWRITE_PREPROC
from tvmfuse.schedules import cpu
from tvmfuse.schedules.cpu import int8_dot
from tvmfuse.targets import avx512_for

#: A core with AVX-512 VNNI (Zen 4), whichever machine compiles; its code runs only on one.
ZEN4 = avx512_for("znver4")
HAS_VNNI = "avx512_vnni" in Path("/proc/cpuinfo").read_text()
rng = np.random.default_rng(0)


def _kernel(kind: str, shape) -> tirx.PrimFunc:
    """The fused kernel ``relu(float32(x @ w) * s)`` (a matmul or an NHWC conv) over uint8 ``x``
    and int8 ``w``, its weight a constant as in a build."""
    if kind == "dense":
        m, k, n = shape
        x_shape, w_shape = (1, m, k), (k, n)
    else:
        h, c, n, size = shape
        x_shape, w_shape = (1, h, h, c), (size, size, c, n)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "uint8"))
    w = relax.Var("w", relax.TensorType(w_shape, "int8"))
    s = relax.Var("s", relax.TensorType((n,), "float32"))
    with bb.function("main", [x, w, s]):
        with bb.dataflow():
            if kind == "dense":
                acc = bb.emit(relax.op.matmul(x, w, out_dtype="int32"))
            else:
                acc = bb.emit(relax.op.nn.conv2d(x, w, padding=size // 2, data_layout="NHWC",
                                                 kernel_layout="HWIO", out_dtype="int32"))
            scaled = bb.emit(relax.op.multiply(relax.op.astype(acc, "float32"), s))
            out = bb.emit_output(relax.op.nn.relu(scaled))
        bb.emit_func_output(out)
    with ZEN4.tvm_target():
        mod = relax.transform.LegalizeOps()(bb.get())
        mod = relax.transform.AnnotateTIROpPattern()(mod)
        mod = relax.transform.FuseOps()(mod)
        mod = relax.transform.FuseTIR()(mod)
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    return func.with_attr("layout_free_buffers", [1])


def _expected(kind, x, w, s):
    x, w = (torch.from_numpy(a.astype("int64")) for a in (x, w))
    if kind == "dense":
        acc = x @ w
    else:
        size = w.shape[0]
        acc = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2).double(),
                                         w.permute(3, 2, 0, 1).double(),
                                         padding=size // 2).permute(0, 2, 3, 1).round().long()
    return np.maximum(acc.numpy().astype("float64") * s, 0)


def _compiled(sch):
    func = sch.mod["main"].with_attr("global_symbol", "main")
    return tvm.compile(tvm.IRModule({"main": func}), target=ZEN4.tvm_target())


def _run(sch, kind, shape):
    func = sch.mod["main"]
    shapes = [[int(d) for d in p.ty.shape] for p in func.params]
    x = rng.integers(0, 256, shapes[0]).astype("uint8")
    w = rng.integers(-127, 128, shapes[1]).astype("int8")
    s = (rng.random(shapes[2]) * 1e-3).astype("float32")
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(shapes[-1], "float32"), dev)
    _compiled(sch).mod["main"](*(tvm.runtime.tensor(a, dev) for a in (x, w, s)), out)
    np.testing.assert_allclose(out.numpy(), _expected(kind, x, w, s), rtol=1e-6, atol=0)


CASES = [("dense", (50, 96, 80)), ("dense", (1, 768, 1000)), ("dense", (128, 64, 256)),
         ("conv", (14, 32, 48, 3)), ("conv", (7, 96, 160, 1)), ("conv", (28, 4, 64, 7))]


@pytest.mark.parametrize("kind,shape", CASES, ids=[f"{k}{s}" for k, s in CASES])
def test_int8_tiles_run_on_vpdpbusd_and_sum_exactly(kind, shape):
    rule = (cpu.Dense if kind == "dense" else cpu.Conv2D)(ZEN4.vector)
    sch = rule.apply(_kernel(kind, shape), ZEN4.tvm_target(), False)
    assert sch is not None and "llvm.x86.avx512.vpdpbusd.512" in sch.mod.script()
    # the weight [..., k, n] packed as [n / panel, ..., k / 4, panel, 4]
    (packing,) = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))
                  if LAYOUT_REWRITE_PREPROC in sch.get(b).annotations]
    packed = [int(d) for d in packing.writes[0].source.ty.shape]
    k = shape[1] if kind == "dense" else shape[1]
    assert packed[-3] == k // 4 and packed[-1] == 4 and packed[-2] % 16 == 0
    assert "vpdpbusd" in _compiled(sch).mod.inspect_source("asm")
    if not HAS_VNNI:
        pytest.skip("this CPU has no AVX-512 VNNI to run the kernel")
    _run(sch, kind, shape)


@pytest.mark.parametrize("reason,kind,shape,vector", [
    ("a core without AVX-512 VNNI", "dense", (24, 64, 96), dict(dot_int8=False)),
    ("a reduction of no whole quads", "conv", (16, 6, 32, 3), {}),
    ("columns in fewer than 16 lanes", "dense", (24, 64, 8), {}),
])
def test_int8_tiles_the_quad_product_does_not_fit_keep_the_scalar_tile(reason, kind, shape,
                                                                       vector):
    rule = (cpu.Dense if kind == "dense" else cpu.Conv2D)(
        dataclasses.replace(ZEN4.vector, **vector))
    sch = rule.apply(_kernel(kind, shape), ZEN4.tvm_target(), False)
    assert sch is not None and "vpdpbusd" not in sch.mod.script(), reason
    if HAS_VNNI or not vector:
        _run(sch, kind, shape)


def test_only_cores_with_avx512_vnni_say_they_have_the_quad_dot_product():
    assert avx512_for("znver4").vector.dot_int8
    assert avx512_for("icelake-server").vector.dot_int8
    assert avx512_for("cascadelake").vector.dot_int8
    assert not avx512_for("skylake-avx512").vector.dot_int8
    assert int8_dot.LANES == ZEN4.vector.lanes
