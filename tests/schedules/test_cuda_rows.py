"""The warp-per-row reduction schedule (``schedules/cuda/rows.py``): which kernels it takes, its
CUDA source (32-thread blocks, warp shuffles, compiled with nvcc here), and on a machine with an
NVIDIA GPU its numbers against NumPy: a float16 LayerNorm and a scale + mask + softmax at row
lengths no warp divides."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te, topi

from tvmfuse import api
from tvmfuse.schedules.cuda.rows import MAX_ROW, WarpRows

from conftest import build_cuda_kernel, cuda_source, nvcc_compiles

TARGET = api.get_target("cuda-sm90").tvm_target()
GPU = tvm.cuda(0).exist


def _layer_norm(rows: int, cols: int):
    """float16 in and out, float32 inside: a LayerNorm as fp16 builds fuse it (with its casts)."""
    x = te.placeholder((rows, cols), "float16", name="x")
    gamma = te.placeholder((cols,), "float32", name="gamma")
    beta = te.placeholder((cols,), "float32", name="beta")
    wide = topi.cast(x, "float32")
    out = topi.cast(topi.nn.layer_norm(wide, gamma, beta, axis=[1], epsilon=1e-5), "float16")
    return te.create_prim_func([x, gamma, beta, out])


def _softmax(rows: int, cols: int):
    """float16 scores scaled, a float32 mask added, softmax, float16 probabilities."""
    x = te.placeholder((rows, cols), "float16", name="scores")
    mask = te.placeholder((rows, cols), "float32", name="mask")
    scaled = te.compute((rows, cols), lambda i, j: x[i, j].astype("float32") * 0.125 + mask[i, j])
    return te.create_prim_func([x, mask, topi.cast(topi.nn.softmax(scaled, axis=1), "float16")])


@pytest.mark.parametrize("kernel", [_layer_norm, _softmax])
def test_a_warp_a_row_with_shuffles_only_and_nvcc_compiles_it(kernel, tmp_path):
    sch = WarpRows().apply(kernel(4096, 197), TARGET, False)
    assert sch is not None
    source = cuda_source(sch, TARGET)
    assert "__launch_bounds__(32)" in source
    assert "__shfl_down_sync" in source and "red_buf_staging" not in source  # no block reduction
    nvcc_compiles(source, tmp_path)


def test_long_rows_and_rows_of_one_are_left_to_dlight():
    assert WarpRows().apply(_layer_norm(64, MAX_ROW + 1), TARGET, False) is None
    assert WarpRows().apply(_layer_norm(64, MAX_ROW), TARGET, False) is not None
    assert WarpRows().apply(_layer_norm(64, 1), TARGET, False) is None  # nothing to reduce


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (run on the GPU host)")
@pytest.mark.parametrize("cols", [77, 128, 197, 768, 1000])
def test_numbers_against_numpy(cols):
    rng = np.random.default_rng(cols)
    rows, dev = 333, tvm.cuda(0)
    for kernel in (_layer_norm, _softmax):
        func = kernel(rows, cols)
        lib = build_cuda_kernel(WarpRows().apply(func, TARGET, False), TARGET)
        x = rng.standard_normal((rows, cols)).astype("float16")
        if kernel is _layer_norm:
            gamma, beta = (rng.standard_normal(cols).astype("float32") for _ in range(2))
            wide = x.astype("float32")
            want = (wide - wide.mean(1, keepdims=True)) / np.sqrt(wide.var(1, keepdims=True)
                                                                   + 1e-5) * gamma + beta
            args = [x, gamma, beta]
        else:
            mask = np.where(rng.random((rows, cols)) < 0.2, -1e4, 0.0).astype("float32")
            scaled = x.astype("float32") * 0.125 + mask
            e = np.exp(scaled - scaled.max(1, keepdims=True))
            want = e / e.sum(1, keepdims=True)
            args = [x, mask]
        tensors = [tvm.runtime.tensor(a, dev) for a in args]
        out = tvm.runtime.tensor(np.full((rows, cols), np.nan, "float16"), dev)
        lib["main"](*tensors, out)
        got = out.numpy().astype("float32")
        assert np.isfinite(got).all()
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < 2e-3, (kernel.__name__, cols, err)
