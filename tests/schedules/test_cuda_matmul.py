"""The tensor-core GEMM schedule (``schedules/cuda/matmul.py``): which kernels it takes, the
instructions its CUDA source holds (compiled with nvcc here), the tile it picks per shape, and,
on a machine with an NVIDIA GPU, its numbers against NumPy in float32."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import te

from tvmfuse import api
from tvmfuse.schedules.cuda.matmul import TILES, MmaTile, TensorCoreMatmul, choose_tile

from conftest import build_cuda_kernel, cuda_source, nvcc_compiles
from cuda_alignment import misaligned

TARGET = api.get_target("cuda-sm90").tvm_target()
GPU = tvm.cuda(0).exist


def _gemm(m, n, k, *, weight_nk=False, batch=None, accumulate="float32", epilogue=True):
    """fp16 (A @ B) [+ bias], cast to fp16: a linear layer as tvmfuse's fp16 builds legalize
    it; ``weight_nk`` stores B as torch stores a weight ([N, K]), ``batch`` adds a batch axis
    to both operands (QK^T, PV)."""
    lead = (batch,) if batch else ()
    a = te.placeholder((*lead, m, k), "float16", name="A")
    b = te.placeholder((*lead, n, k) if weight_nk else (*lead, k, n), "float16", name="B")
    r = te.reduce_axis((0, k), "k")

    def product(*index):
        *s, i, j = index
        rhs = b[(*s, j, r)] if weight_nk else b[(*s, r, j)]
        return te.sum(a[(*s, i, r)].astype(accumulate) * rhs.astype(accumulate), axis=r)

    c = te.compute((*lead, m, n), product, name="matmul")
    args = [a, b]
    if epilogue:
        bias = te.placeholder((n,), "float16", name="bias")
        out = te.compute(c.shape, lambda *i: (c[i] + bias[i[-1]].astype(accumulate)).astype(
            "float16"), name="T_add")
        args.append(bias)
    else:
        out = te.compute(c.shape, lambda *i: c[i].astype("float16"), name="T_cast")
    return te.create_prim_func([*args, out])


def _source(sch) -> str:
    return cuda_source(sch, TARGET)


@pytest.mark.parametrize("m,n,k,weight_nk", [(256, 256, 128, False), (197, 768, 77, True),
                                             (77, 100, 33, False)])
def test_source_has_mma_ldmatrix_and_cp_async_and_nvcc_compiles_it(tmp_path, m, n, k, weight_nk):
    sch = TensorCoreMatmul().apply(_gemm(m, n, k, weight_nk=weight_nk), TARGET, False)
    assert sch is not None
    source = _source(sch)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in source
    assert "ldmatrix.sync.aligned.m8n8.x4" in source
    # 16-byte copies where the operands' rows are whole 16-byte pieces (B stored [K, N] copied
    # along N, not gathered along K: that was a misaligned address on the GPU); rows of 77 or
    # 33 halves are copied element by element, zeros past the end
    aligned = k % 8 == 0 and (weight_nk or n % 8 == 0)
    assert ("cp.async.cg.shared.global" in source) == aligned
    assert "cp.async.wait_group" in source
    # every copy through tvmfuse's cp.async helper: the source offset a 64-bit sum
    # (schedules/cuda/cp_async.py), none through TVM's int-offset one
    assert "ptx_cp_async_legacy" not in source
    assert ("long long src_off" in source) == aligned
    nvcc_compiles(source, tmp_path)


def _sliced_gemm(m, n, k, offset):
    """fp16 A[:, offset:offset + k] @ B ([K, N]), A's rows ``k + 8`` long: the slice is read
    through the copies to shared memory."""
    a = te.placeholder((m, k + 8), "float16", name="A")
    b = te.placeholder((k, n), "float16", name="B")
    sliced = te.compute((m, k), lambda i, j: a[i, j + offset], name="slice")
    r = te.reduce_axis((0, k), "k")
    c = te.compute((m, n), lambda i, j: te.sum(
        sliced[i, r].astype("float32") * b[r, j].astype("float32"), axis=r), name="matmul")
    out = te.compute((m, n), lambda i, j: c[i, j].astype("float16"), name="T_cast")
    return te.create_prim_func([a, b, out])


@pytest.mark.parametrize("func,copied_16_bytes", [
    (_gemm(3136, 32, 49, batch=1, epilogue=False), False),  # SegFormer's PV: rows of 49 keys
    (_sliced_gemm(128, 64, 64, 4), False),  # a slice 4 halves into each row
    (_sliced_gemm(128, 64, 64, 8), True),
])
def test_copies_to_shared_memory_are_vectors_only_where_aligned(func, copied_16_bytes):
    """A 16-byte copy (cp.async) from an address that is not a multiple of 16 bytes faults on
    the GPU (cudaErrorMisalignedAddress): rows, and offsets into them, that are not whole
    16-byte pieces are copied element by element."""
    source = _source(TensorCoreMatmul().apply(func, TARGET, False))
    assert misaligned(source) == []
    # (the alignment check reads cp.async's offsets too) B's rows (32 or 64 halves) are copied
    # 16 bytes at a time in every case; A's only where aligned
    a_async = [line for line in source.splitlines()
               if "tvmfuse_cp_async" in line and "A_ptr" in line]
    assert bool(a_async) == copied_16_bytes


def test_widened_offsets_keep_their_values_in_64_bits():
    """cp_async.widen: the offset rebuilt as an int64 sum of int64 terms, the terms it cannot
    widen (shifts, divisions) computed as before and then cast; the same value everywhere."""
    from tvm import tirx

    from tvmfuse.schedules.cuda.cp_async import widen

    i, j = tirx.Var("i", "int32"), tirx.Var("j", "int32")
    expr = (i >> 3) * 4096 + j * 64 + tirx.floordiv(j, 3) - 7 + 2 * i
    wide = widen(expr)
    assert str(wide.ty) == "int64"
    text = str(wide)
    assert "i64" in text or "int64" in text
    for iv, jv in ((0, 0), (1000, 7), (8191, 123456)):
        analyzer = tvm.sym.Analyzer()
        analyzer.bind(i, iv)
        analyzer.bind(j, jv)
        narrow, value = analyzer.simplify(expr), analyzer.simplify(wide)
        assert int(narrow) == int(value) == (iv >> 3) * 4096 + jv * 64 + jv // 3 - 7 + 2 * iv


@pytest.mark.parametrize("n,store", [(256, "*(uint4*)(T_add_ptr"), (100, "*(half4*)(T_add_ptr"),
                                     (77, "T_add_ptr[")])
def test_epilogue_stores_16_bytes_where_rows_allow_and_pads_the_accumulators(n, store):
    """Each thread stores 8 halves (16 bytes) where the output's rows are whole 16-byte pieces,
    fewer where they are not (a vector across two rows would be a misaligned address on the
    GPU); the accumulators' shared copy has rows of 8 floats more than the tile (136, not 128)."""
    source = _source(TensorCoreMatmul(tile=MmaTile(2, 2, 4, 4)).apply(
        _gemm(256, n, 64, weight_nk=True), TARGET, False))
    assert store in source
    # the accumulators' stores (TVM's mma_store: a shuffle per register) index rows of 136
    stores = [line for line in source.splitlines() if "__shfl_sync(__activemask()" in line]
    assert stores and all("* 136)" in line for line in stores)


def test_an_epilogue_with_a_math_intrinsic_stores_four_lanes_and_compiles(tmp_path):
    """A gated MLP's up projection times SiLU(gate) (Cohere's, Gemma's): the epilogue computes
    ``sigmoid`` in float32, which TVM's CUDA codegen printed, over eight lanes, as a
    ``make_ulonglong4`` of eight floats that NVRTC refused; four lanes a thread compile."""
    a = te.placeholder((256, 64), "float16", name="A")
    b = te.placeholder((256, 64), "float16", name="B")
    gate = te.placeholder((256, 256), "float16", name="gate")
    r = te.reduce_axis((0, 64), "k")
    c = te.compute((256, 256), lambda i, j: te.sum(
        a[i, r].astype("float32") * b[j, r].astype("float32"), axis=r), name="matmul")
    g = lambda i, j: gate[i, j].astype("float32")  # noqa: E731
    out = te.compute(c.shape, lambda i, j: (g(i, j) * te.sigmoid(g(i, j)) * c[i, j]).astype(
        "float16"), name="T_multiply")
    sch = TensorCoreMatmul().apply(te.create_prim_func([a, b, gate, out]), TARGET, False)
    source = _source(sch)
    assert "make_ulonglong4" not in source and "*(half4*)(T_multiply_ptr" in source
    nvcc_compiles(source, tmp_path)


def test_an_epilogue_scaling_rows_by_float32_stores_four_lanes_and_compiles(tmp_path):
    """A GEMM times a float32 scale per row (Inkling's): the scale, one element for a vector of
    eight columns, was broadcast as a ``make_ulonglong4`` of eight floats that NVRTC refused;
    four lanes a thread compile."""
    a = te.placeholder((256, 64), "float16", name="A")
    b = te.placeholder((256, 64), "float16", name="B")
    scale = te.placeholder((256,), "float32", name="scale")
    r = te.reduce_axis((0, 64), "k")
    c = te.compute((256, 256), lambda i, j: te.sum(
        a[i, r].astype("float32") * b[j, r].astype("float32"), axis=r), name="matmul")
    out = te.compute(c.shape, lambda i, j: (c[i, j] * scale[i]).astype("float16"),
                     name="T_multiply")
    source = _source(TensorCoreMatmul().apply(te.create_prim_func([a, b, scale, out]), TARGET,
                                              False))
    assert "make_ulonglong4" not in source and "*(half4*)(T_multiply_ptr" in source
    nvcc_compiles(source, tmp_path)


def test_blocks_per_sm_bounds_the_registers(tmp_path):
    """A tile with ``blocks_per_sm`` launches with ``__launch_bounds__(threads, blocks)``: three
    blocks of 128 threads an SM leave 170 registers a thread (the 128 x 128 tile takes about
    210 without the bound); without it the kernel has one bound only."""
    func = _gemm(512, 512, 512, weight_nk=True)
    bounded = _source(TensorCoreMatmul(tile=MmaTile(2, 2, 4, 4, 2, 3, 3)).apply(
        func, TARGET, False))
    assert "__launch_bounds__(128, 3)" in bounded
    assert "__launch_bounds__(128)" in _source(TensorCoreMatmul(tile=MmaTile(2, 2, 4, 4)).apply(
        func, TARGET, False))
    nvcc_compiles(bounded, tmp_path)


def test_takes_only_fp16_matmuls():
    assert TensorCoreMatmul().apply(_gemm(64, 64, 64), TARGET, False) is not None
    a = te.placeholder((64, 64), "float32", name="A")
    r = te.reduce_axis((0, 64), "k")
    fp32 = te.create_prim_func([a, te.compute((64, 64), lambda i, j: te.sum(
        a[i, r] * a[r, j], axis=r), name="matmul")])
    assert TensorCoreMatmul().apply(fp32, TARGET, False) is None
    rows = te.create_prim_func([a, te.compute((64,), lambda i: te.sum(a[i, r], axis=r))])
    assert TensorCoreMatmul().apply(rows, TARGET, False) is None


def test_tile_fills_the_gpu():
    """Large GEMMs take 128 x 128 tiles; a batch-1 BERT GEMM (128 rows) smaller ones, so that
    its blocks still cover the 132 SMs; every tile fits the shared memory of an SM."""
    assert choose_tile(1, 4096, 4096, 64) == TILES[0]
    small = choose_tile(1, 128, 768)
    assert small.block_m * small.block_n < TILES[0].block_m * TILES[0].block_n
    assert -(-128 // small.block_m) * -(-768 // small.block_n) >= 48
    assert all(t.shared_bytes() <= 227 * 1024 for t in TILES)
    assert MmaTile(2, 2, 4, 4).block_k == 32


def test_deep_reductions_take_steps_of_64_but_on_128x64_blocks():
    """K steps of 64 where the reduction has at least four of them (measured faster on the H200
    at K = 768 and 3072 on 128 x 128 blocks and on small ones), of 32 where it is shallow (a 1x1
    conv over 64 channels) or the block 128 x 64 (slower with 64 at N = 768)."""
    assert choose_tile(1, 4096, 4096, 4096).block_k == 64
    assert choose_tile(1, 4096, 4096, 768).block_k == 64
    assert choose_tile(1, 100352, 256, 64).block_k == 32
    narrow = choose_tile(1, 4096, 768, 3072)
    assert (narrow.block_m, narrow.block_n, narrow.block_k) == (128, 64, 32)
    small = choose_tile(1, 128, 768, 3072)  # BERT b1 FFN2
    assert small.block_m < 128 and small.block_k == 64
    assert choose_tile(1, 4096, 4096, 64) == dataclasses.replace(choose_tile(1, 4096, 4096, 4096),
                                                                  chunk_k=2)
    assert all(dataclasses.replace(t, chunk_k=4).shared_bytes() <= 113 * 1024 for t in TILES)


CASES = [  # (m, n, k, weight_nk, batch, tile): multiples, BERT shapes, sizes no tile divides
    (256, 256, 256, False, None, None), (128, 768, 3072, True, None, None),
    (197, 768, 768, True, None, None), (77, 100, 33, False, None, None),
    (1000, 1000, 1000, False, None, None), (64, 64, 64, True, 12, None),
    (50, 77, 300, True, None, None),
    # three blocks an SM: the registers ptxas fits to the bound
    (1000, 1000, 1000, True, None, MmaTile(2, 2, 4, 4, 2, 3, blocks_per_sm=3)),
]


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (run on the GPU host)")
@pytest.mark.parametrize("m,n,k,weight_nk,batch,tile", CASES)
def test_numbers_against_numpy(m, n, k, weight_nk, batch, tile):
    func = _gemm(m, n, k, weight_nk=weight_nk, batch=batch)
    sch = TensorCoreMatmul(tile=tile).apply(func, TARGET, False)
    assert sch is not None
    lib = build_cuda_kernel(sch, TARGET)
    rng = np.random.default_rng(m + n + k)
    lead = (batch,) if batch else ()
    a = rng.standard_normal((*lead, m, k)).astype("float16")
    b = rng.standard_normal((*lead, n, k) if weight_nk else (*lead, k, n)).astype("float16")
    bias = rng.standard_normal(n).astype("float16")
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.zeros((*lead, m, n), "float16"), dev)
    lib["main"](*(tvm.runtime.tensor(x, dev) for x in (a, b, bias)), out)
    rhs = np.swapaxes(b, -1, -2) if weight_nk else b
    want = a.astype("float32") @ rhs.astype("float32") + bias.astype("float32")
    got = out.numpy().astype("float32")
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3
