"""bf16 GEMMs and convs on AVX-512 BF16 (schedules/cpu/bf16_dot.py): the register tile's inner
16 lanes x 2 reduction steps are one ``vdpbf16ps``, the weights packed in pairs; where the core
lacks the instruction, or the reduction or the columns do not fit it, the float32 tile as before.
The numbers are float32 sums of the bf16 inputs' products, as PyTorch computes them."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
import tvm
from tvm import relax, tirx

from tvmfuse import api
from tvmfuse.names import LAYOUT_REWRITE_PREPROC
from tvmfuse.schedules import cpu
from tvmfuse.schedules.cpu import bf16_dot
from tvmfuse.targets import avx512_for
from tvmfuse.verify import verify

from conftest import relax_main

#: A core with AVX-512 BF16 (Zen 4), whichever machine compiles; its code runs only on one.
ZEN4 = avx512_for("znver4")
HAS_BF16 = "avx512_bf16" in Path("/proc/cpuinfo").read_text()
rng = np.random.default_rng(0)


def _kernel(inputs, body) -> tirx.PrimFunc:
    """The fused kernel of ``body`` over bf16 ``inputs``, its weight (input 1) a constant."""
    with ZEN4.tvm_target():
        mod = relax.transform.LegalizeOps()(relax_main(dict(inputs), body, "bfloat16"))
        mod = relax.transform.AnnotateTIROpPattern()(mod)
        mod = relax.transform.FuseOps()(mod)
        mod = relax.transform.FuseTIR()(mod)
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    return func.with_attr("layout_free_buffers", [1])


def _dense(m, k, n):
    def body(bb, x, w, b):
        y = bb.emit(relax.op.matmul(x, w, out_dtype="float32"))
        return relax.op.nn.relu(bb.emit(relax.op.add(y, relax.op.astype(b, "float32"))))

    return [("x", (1, m, k)), ("w", (k, n)), ("b", (n,))], body


def _conv(h, c, o, k):
    def body(bb, x, w, b):
        y = bb.emit(relax.op.nn.conv2d(x, w, padding=k // 2, data_layout="NHWC",
                                       kernel_layout="HWIO", out_dtype="float32"))
        return relax.op.nn.relu(bb.emit(relax.op.add(y, relax.op.astype(b, "float32"))))

    return [("x", (1, h, h, c)), ("w", (k, k, c, o)), ("b", (1, 1, 1, o))], body


def _expected(kind, x, w, b):
    x, w, b = (torch.from_numpy(a.astype("float32")).double() for a in (x, w, b))
    if kind == "dense":
        y = x @ w
    else:
        k = w.shape[0]
        y = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1),
                                       padding=k // 2).permute(0, 2, 3, 1)
    return torch.relu(y + b).numpy()


def _compile(sch):
    func = sch.mod["main"].with_attr("global_symbol", "main")
    return tvm.compile(tvm.IRModule({"main": func}), target=ZEN4.tvm_target())


def _calls(sch) -> int:
    return sch.mod.script().count("tvmfuse_dpbf16ps")


CASES = [("dense", (50, 98, 77)), ("dense", (1, 768, 256)), ("dense", (197, 64, 80)),
         ("conv", (14, 32, 48, 3)), ("conv", (7, 96, 160, 1))]


@pytest.mark.parametrize("kind,shape", CASES, ids=[f"{k}{s}" for k, s in CASES])
def test_bf16_tiles_run_on_the_pair_dot_product_and_match_pytorch(kind, shape):
    inputs, body = (_dense if kind == "dense" else _conv)(*shape)
    rule = (cpu.Dense if kind == "dense" else cpu.Conv2D)(ZEN4.vector)
    sch = rule.apply(_kernel(inputs, body), ZEN4.tvm_target(), False)
    assert sch is not None and _calls(sch) == 1  # one tensorized call, in the unrolled tile
    # the weight [..., k, n] packed as [n / panel, ..., k / 2, panel, 2]
    (packing,) = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))
                  if LAYOUT_REWRITE_PREPROC in sch.get(b).annotations]
    packed = [int(d) for d in packing.writes[0].source.ty.shape]
    k = dict(inputs)["w"][-2]
    assert packed[-3] == k // 2 and packed[-1] == 2 and packed[-2] % 16 == 0
    asm = _compile(sch).mod.inspect_source("asm")
    assert "vdpbf16ps" in asm and "call" not in [
        line.split()[0] for line in asm.splitlines() if "tvmfuse_dpbf16ps" in line]
    if not HAS_BF16:
        pytest.skip("this CPU has no AVX-512 BF16 to run the kernel")
    x, w, b = (rng.standard_normal(s).astype(ml_dtypes.bfloat16) for _, s in inputs)
    out = _run(sch, [x, w, b])
    np.testing.assert_allclose(out, _expected(kind, x, w, b), rtol=1e-4, atol=1e-4)


def _run(sch, arrays):
    func = sch.mod["main"]
    shape = [int(d) for d in func.params[-1].ty.shape]
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    out = tvm.runtime.tensor(np.zeros(shape, "float32"), dev)
    _compile(sch).mod["main"](*args, out)
    return out.numpy()


@pytest.mark.parametrize("reason,kind,shape,vector", [
    ("a core without AVX-512 BF16", "dense", (24, 64, 96), dict(dot_bf16=False)),
    ("an odd reduction (an RGB stem's 3 input channels)", "conv", (16, 3, 32, 3), {}),
    ("columns in fewer than 16 lanes", "dense", (24, 64, 8), {}),
])
def test_bf16_tiles_the_pair_product_does_not_fit_keep_the_float32_tile(reason, kind, shape,
                                                                        vector):
    inputs, body = (_dense if kind == "dense" else _conv)(*shape)
    rule = (cpu.Dense if kind == "dense" else cpu.Conv2D)(
        dataclasses.replace(ZEN4.vector, **vector))
    sch = rule.apply(_kernel(inputs, body), ZEN4.tvm_target(), False)
    assert sch is not None and _calls(sch) == 0, reason
    if HAS_BF16:
        x, w, b = (rng.standard_normal(s).astype(ml_dtypes.bfloat16) for _, s in inputs)
        np.testing.assert_allclose(_run(sch, [x, w, b]), _expected(kind, x, w, b), rtol=1e-4,
                                   atol=1e-4)


def test_only_cores_with_avx512_bf16_say_they_have_the_pair_dot_product():
    assert avx512_for("znver4").vector.dot_bf16
    assert avx512_for("sapphirerapids").vector.dot_bf16
    assert not avx512_for("skylake-avx512").vector.dot_bf16
    assert not avx512_for("icelake-server").vector.dot_bf16
    assert not api.get_target("avx2").vector.dot_bf16
    assert bf16_dot.LANES == ZEN4.vector.lanes


@pytest.mark.parametrize("name,kind,kernels", [("tiny-transformer", "cpu.dense", 4),
                                               ("tiny-resnet", "cpu.conv2d", 4)])
def test_a_bf16_model_built_for_a_bf16_core_verifies_and_runs_on_vdpbf16ps(name, kind, kernels,
                                                                          tmp_path):
    """Every GEMM or conv of the model on the pair dot product (the RGB stem too, its input
    channels padded to 4), and the model as accurate as PyTorch's own bf16."""
    if not HAS_BF16:
        pytest.skip("this CPU has no AVX-512 BF16")
    model = api.import_model(name)
    compiled = api.compile_model(model, api.get_target("avx512"),
                                 api.BuildOptions(dtype="bfloat16", use_database=False))
    assert list(compiled.analysis.implementations.values()).count(kind) == kernels
    out = api.build(compiled, tmp_path / "out")
    verify(api.load(out), model)  # against PyTorch in float32 and in bfloat16
    if shutil.which("objdump"):
        asm = subprocess.run(["objdump", "-d", str(out / "model.so")], capture_output=True,
                             text=True, check=True).stdout
        assert asm.count("vdpbf16ps") >= kernels
