"""The hand-written mma.sync GEMM (``schedules/cuda/mma_gemm.py``): its CUDA source (mma.sync,
ldmatrix, cp.async with a zero-fill source size, compiled with nvcc for sm_80 and sm_90 here),
the tiles it refuses, and on a machine with an NVIDIA GPU its numbers against NumPy in float32,
at sizes no tile divides."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from tvmfuse.schedules.cuda.mma_gemm import MmaGemmTile, gemm_kernel

from conftest import nvcc_compiles

GPU = tvm.cuda(0).exist


def _bias_relu(m, n, k, tile=None, dtype="float16"):
    """``relu(A @ B^T + bias)`` cast to ``dtype``: the kernel with an epilogue reading a buffer."""
    bias = tvm.tirx.decl_buffer((n,), dtype, name="bias")
    return gemm_kernel(m, n, k, tile, out_dtype=dtype, in_dtype=dtype, extra=(bias,),
                       epilogue=lambda acc, row, col: T.Cast(
                           dtype, T.max(acc + T.Cast("float32", bias[col]), T.float32(0))))


def _source(func, arch="sm_90a") -> str:
    target = tvm.target.Target({"kind": "cuda", "arch": arch, "host": "llvm"})
    lib = tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")
    return lib.mod.imports[0].inspect_source()


@pytest.mark.parametrize("m,n,k,tile", [
    (4096, 4096, 4096, MmaGemmTile()), (1000, 1000, 1000, MmaGemmTile(2, 2, 64, 64, 3)),
    (77, 100, 40, MmaGemmTile(2, 2, 32, 32, 3)),
    (1000, 1000, 1000, MmaGemmTile(2, 4, 64, 32, 3, blocks_per_sm=2))])
def test_source_has_mma_ldmatrix_cp_async_and_nvcc_compiles_it(tmp_path, m, n, k, tile):
    source = _source(_bias_relu(m, n, k, tile))
    # a warp's tile in m16n8k16 mmas a slice, 4 slices a step
    assert source.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 1
    calls = re.findall(r"tvm_builtin_ptx_mma_sync\w*\(acc", source)
    assert len(calls) == (tile.warp_m // 16) * (tile.warp_n // 8) * 4
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in source
    # copies with a source size: zeros past M, N and K
    assert "cp.async.cg.shared.global [%0], [%1], 16, %2;" in source
    assert f"cp.async.wait_group {tile.stages - 2};" in source
    bounds = f", {tile.blocks_per_sm}" if tile.blocks_per_sm > 1 else ""
    assert f"__launch_bounds__({tile.threads}{bounds})" in source
    nvcc_compiles(source, tmp_path, arch="sm_90")


def test_bf16_and_sm80(tmp_path):
    source = _source(_bias_relu(256, 192, 128, MmaGemmTile(2, 2, 64, 32, 3), "bfloat16"),
                     arch="sm_80")
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in source
    nvcc_compiles(source, tmp_path, arch="sm_80")


def test_refuses_what_it_cannot_compute():
    with pytest.raises(ValueError, match="multiple of 8"):
        gemm_kernel(64, 64, 44)
    with pytest.raises(ValueError, match="multiples of 16"):
        gemm_kernel(64, 64, 64, MmaGemmTile(warp_m=24))
    with pytest.raises(ValueError, match="at least 3 stages"):
        gemm_kernel(64, 64, 64, MmaGemmTile(stages=2))
    with pytest.raises(ValueError, match="shared memory"):
        gemm_kernel(64, 64, 64, MmaGemmTile(4, 4, 64, 64, 4))
    with pytest.raises(ValueError, match="2 blocks an SM"):
        gemm_kernel(64, 64, 64, MmaGemmTile(2, 4, 64, 32, 4, blocks_per_sm=2))
    with pytest.raises(ValueError, match="divide evenly"):
        gemm_kernel(64, 64, 64, MmaGemmTile(1, 1, 16, 16, 3))


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (run on the GPU host)")
@pytest.mark.parametrize("m,n,k,tile,dtype", [
    (512, 512, 512, None, "float16"),
    (1000, 1000, 1000, None, "float16"),
    (1000, 1000, 1000, MmaGemmTile(2, 2, 64, 64, 3), "float16"),
    (77, 100, 40, MmaGemmTile(2, 2, 32, 32, 3), "float16"),
    (130, 72, 520, MmaGemmTile(2, 2, 64, 32, 4), "float16"),
    (4096, 768, 3072, None, "float16"),
    (1000, 1000, 1000, MmaGemmTile(2, 4, 64, 32, 3, blocks_per_sm=2), "float16"),
    (130, 72, 520, MmaGemmTile(4, 2, 32, 64, 3, blocks_per_sm=2), "float16"),
    (300, 200, 264, None, "bfloat16")])
def test_numbers_against_numpy(m, n, k, tile, dtype):
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a", "host": "llvm"})
    lib = tvm.compile(tvm.IRModule({"main": _bias_relu(m, n, k, tile, dtype)}), target=target,
                      tir_pipeline="tirx")
    rng = np.random.default_rng(m + n + k)
    store = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    a, b = (rng.standard_normal(shape).astype(store) for shape in ((m, k), (n, k)))
    bias = rng.standard_normal(n).astype(store)
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((m, n), np.nan, store), dev)
    lib["main"](*(tvm.runtime.tensor(x, dev) for x in (a, b, bias)), out)
    want = np.maximum(a.astype("float32") @ b.astype("float32").T + bias.astype("float32"), 0)
    got = out.numpy().astype("float32")
    assert np.isfinite(got).all(), "outputs left unwritten"
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < (
        2e-3 if dtype == "float16" else 8e-3)


def _pass_input(m, n, k, lead=(1,), dtype="float16"):
    """A Relax module calling a fused linear layer + bias + GELU (``test_cuda_wgmma._fused``)
    with a constant weight [K, N], as LegalizeOps writes it; and that weight."""
    from test_cuda_wgmma import _fused  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    from conftest import relax_main  # noqa: PLC0415

    rng = np.random.default_rng(1)
    store = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    weight = rng.standard_normal((k, n)).astype(store)
    bias = rng.standard_normal(n).astype(store)

    def body(bb, x):
        gvar = bb.add_func(_fused(m, n, k, lead=lead, dtype=dtype), "fused_gemm")
        return relax.call_tir(gvar, [x, relax.const(weight, dtype), relax.const(bias, dtype)],
                              relax.TensorType((*lead, m, n), dtype))

    return relax_main({"x": (*lead, m, k)}, body, dtype), weight, bias


def test_pass_places_gemms_wgmma_leaves_on_the_mma_kernel(tmp_path):
    from tvmfuse.passes import UseWgmmaGemms  # noqa: PLC0415

    sm90a = tvm.target.Target({"kind": "cuda", "arch": "sm_90a", "host": "llvm"})
    # BERT's batch-1 QKV: 128 rows, too few for wgmma; 64 x 64 blocks
    before, weight, _ = _pass_input(128, 2304, 768)
    assert UseWgmmaGemms(sm90a)(before)["fused_gemm"].attrs.get("tvmfuse.schedule") is None
    after = UseWgmmaGemms(sm90a, mma=True)(before)
    kernel = after["fused_gemm"]
    assert kernel.attrs["tvmfuse.schedule"] == "cuda.mma_gemm"
    assert [int(d) for d in kernel.params[1].shape] == [2304, 768]  # the weight now [N, K]
    calls = _kernel_calls(after["main"])
    np.testing.assert_array_equal(calls[0].args[1].fields[1].value.numpy(), weight.T)
    source = _source(kernel.without_attr("target"))
    # the fused epilogue (GELU's erf) on the accumulators, 4 warps of 32 x 32
    assert "erff(" in source and "__launch_bounds__(128)" in source
    nvcc_compiles(source, tmp_path, arch="sm_90")
    # a block narrower than 64 (N = 768 at 128 rows: 32 x 32 blocks fill more SMs) stays
    narrow, _, _ = _pass_input(128, 768, 3072)
    assert UseWgmmaGemms(sm90a, mma=True)(narrow)["fused_gemm"].attrs.get(
        "tvmfuse.schedule") is None


def _kernel_calls(func):
    from tvm import relax  # noqa: PLC0415

    found = []
    relax.analysis.post_order_visit(func, lambda e: found.append(e) if isinstance(
        e, relax.Call) and isinstance(e.args[0], tvm.ir.GlobalVar) else None)
    return found


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (run on the GPU host)")
@pytest.mark.parametrize("m,n,k,lead,dtype", [
    (128, 2304, 768, (1,), "float16"), (197, 3072, 768, (1,), "float16"),
    (200, 520, 264, (3,), "bfloat16")])
def test_fused_kernel_numbers_against_numpy(m, n, k, lead, dtype):
    """The kernel the pass makes from a fused linear layer (leading axes, bias, GELU)."""
    from test_cuda_wgmma import check_linear_gelu  # noqa: PLC0415

    from tvmfuse.passes import UseWgmmaGemms  # noqa: PLC0415

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a", "host": "llvm"})
    before, weight, bias = _pass_input(m, n, k, lead, dtype)
    kernel = UseWgmmaGemms(target, mma=True)(before)["fused_gemm"]
    assert kernel.attrs["tvmfuse.schedule"] == "cuda.mma_gemm"
    lib = tvm.compile(tvm.IRModule({"main": kernel.without_attr("target")}), target=target,
                      tir_pipeline="tirx")
    store = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    a = np.random.default_rng(m).standard_normal((*lead, m, k)).astype(store)
    check_linear_gelu(lib, a, weight, bias, dtype)
