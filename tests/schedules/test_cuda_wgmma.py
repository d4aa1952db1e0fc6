"""The Hopper wgmma GEMM (``schedules/cuda/wgmma.py``) and the pass that uses it
(``UseWgmmaGemms``): which fused kernels it takes, its CUDA source (wgmma, TMA, mbarriers,
compiled with nvcc for sm_90a here), the weights it transposes, and on a machine with an
NVIDIA GPU its numbers against NumPy in float32, at sizes no tile divides."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import relax, te
from tvm.script import tirx as T

from tvmfuse.passes import UseWgmmaGemms
from tvmfuse.schedules.cuda.conv_match import match_conv
from tvmfuse.schedules.cuda.gemm_match import match_gemm
from tvmfuse.schedules.cuda.wgmma import gemm_kernel
from tvmfuse.schedules.cuda.wgmma_tile import ConvGeometry, WgmmaTile, choose_wgmma_tile

from conftest import nvcc_compiles, relax_main

SM90A = tvm.target.Target({"kind": "cuda", "arch": "sm_90a", "host": "llvm"})
GPU = tvm.cuda(0).exist


def _fused(m, n, k, *, lead=(), act=True, weight_nk=False, accumulate="float32",
           dtype="float16"):
    """A legalized linear layer: ``dtype`` A [*lead, m, k] @ W ([K, N] as LegalizeOps writes
    it), float32 sums, + bias, GELU, cast: the fused kernel tvmfuse's fp16 builds make."""
    a = te.placeholder((*lead, m, k), dtype, name="A")
    w = te.placeholder((n, k) if weight_nk else (k, n), dtype, name="W")
    bias = te.placeholder((n,), dtype, name="bias")
    r = te.reduce_axis((0, k), "k")
    c = te.compute((*lead, m, n), lambda *i: te.sum(
        a[(*i[:-1], r)].astype(accumulate) * (w[i[-1], r] if weight_nk else w[r, i[-1]]).astype(
            accumulate), axis=r), name="matmul")
    added = te.compute(c.shape, lambda *i: c[i] + bias[i[-1]].astype(accumulate), name="add")
    out = te.compute(c.shape, lambda *i: (
        added[i] * 0.5 * (1 + te.erf(added[i] * 0.7071067811865476)) if act else added[i]
    ).astype(dtype), name="out")
    return te.create_prim_func([a, w, bias, out])


def _conv(n, hw, cin, cout, *, window=1, stride=1):
    """A legalized NHWC conv with an OHWI weight, float32 sums, + bias, ReLU, cast."""
    x = te.placeholder((n, hw, hw, cin), "float16", name="X")
    w = te.placeholder((cout, window, window, cin), "float16", name="W")
    bias = te.placeholder((1, 1, 1, cout), "float16", name="bias")
    ry, rx, rc = (te.reduce_axis((0, e), name) for e, name in ((window, "ry"), (window, "rx"),
                                                                (cin, "rc")))
    out_hw = (hw - window) // stride + 1
    conv = te.compute((n, out_hw, out_hw, cout), lambda b, h, v, o: te.sum(
        x[b, h * stride + ry, v * stride + rx, rc].astype("float32")
        * w[o, ry, rx, rc].astype("float32"), axis=[ry, rx, rc]), name="conv2d_nhwc")
    out = te.compute(conv.shape, lambda *i: te.max(
        conv[i].astype("float16") + bias[0, 0, 0, i[-1]], te.const(0, "float16")), name="out")
    return te.create_prim_func([x, w, bias, out])


def _legalized_conv(shape, cout, window, *, stride=1, padding=0, dilation=1,
                    dtype="float16", residual=False):
    """The fused kernel of an NHWC conv (OHWI weight, float32 sums) + bias [+ residual] + ReLU
    as tvmfuse's CUDA builds legalize and fuse it: topi's padding block, then the conv, then
    the epilogue; with the parameters (X, W, bias, [residual,] out)."""
    def body(bb, x, w, bias, *res):
        conv = relax.op.nn.conv2d(x, w, strides=stride, padding=padding, dilation=dilation,
                                  data_layout="NHWC", kernel_layout="OHWI", out_dtype="float32")
        y = relax.op.add(relax.op.astype(conv, dtype), bias)
        return relax.op.nn.relu(relax.op.add(y, res[0]) if res else y)

    h, w = shape[1:3]
    top, left, bottom, right = (padding,) * 4 if isinstance(padding, int) else padding
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    out_shape = (shape[0], (h + top + bottom - dilation * (window - 1) - 1) // sh + 1,
                 (w + left + right - dilation * (window - 1) - 1) // sw + 1, cout)
    mod = relax_main({"x": shape, "w": (cout, window, window, shape[-1]),
                      "bias": (1, 1, 1, cout), **({"res": out_shape} if residual else {})},
                     body, dtype)
    mod = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(), relax.transform.FuseTIR()])(mod)
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return func


def _source(func) -> str:
    lib = tvm.compile(tvm.IRModule({"main": func}), target=SM90A, tir_pipeline="tirx")
    return lib.mod.imports[0].inspect_source()


@pytest.mark.parametrize("lead,weight_nk", [((4,), False), ((), True)])
def test_match_reads_operands_layout_and_epilogue(lead, weight_nk):
    found = match_gemm(_fused(96, 200, 72, lead=lead, weight_nk=weight_nk))
    assert found is not None
    assert (found.m, found.n, found.k, found.b_kn) == (96 * (lead[0] if lead else 1), 200, 72,
                                                       not weight_nk)
    assert found.b_index == 1
    kernel = found.kernel()
    # the fused kernel's parameters, in its order; B now [N, K], A and C keep their batch axes
    assert [tuple(int(d) for d in p.shape) for p in kernel.params] == [
        (*lead, 96, 72), (200, 72), (200,), (*lead, 96, 200)]


def test_match_reads_a_1x1_conv_as_a_gemm():
    found = match_gemm(_conv(2, 14, 64, 96))
    assert found is not None
    assert (found.m, found.n, found.k, found.b_kn) == (2 * 14 * 14, 96, 64, False)
    # the OHWI weight is already K-major: read as it is, [N, 1, 1, K]
    assert [tuple(int(d) for d in p.shape) for p in found.kernel().params] == [
        (2, 14, 14, 64), (96, 1, 1, 64), (1, 1, 1, 96), (2, 14, 14, 96)]
    assert match_gemm(_conv(2, 14, 64, 96, stride=2)) is None  # rows not contiguous
    assert match_gemm(_conv(2, 14, 64, 96, window=3)) is None  # an implicit GEMM, not a GEMM


@pytest.mark.parametrize("shape,cout,window,options,geometry", [
    ((2, 14, 14, 64), 32, 3, {"padding": 1},
     ConvGeometry(2, 14, 14, 64, 14, 14, (3, 3), padding=(1, 1))),
    ((2, 14, 14, 64), 32, 3, {"stride": 2, "padding": 1},
     ConvGeometry(2, 14, 14, 64, 7, 7, (3, 3), stride=(2, 2), padding=(1, 1))),
    # top 1, left 0, bottom 1, right 2; strides (1, 2)
    ((2, 15, 13, 64), 32, 3, {"stride": (1, 2), "padding": (1, 0, 1, 2)},
     ConvGeometry(2, 15, 13, 64, 15, 7, (3, 3), stride=(1, 2), padding=(1, 0))),
    ((2, 14, 14, 64), 32, 1, {"stride": 2},
     ConvGeometry(2, 14, 14, 64, 7, 7, (1, 1), stride=(2, 2))),
    ((2, 14, 14, 64), 32, 3, {"dilation": 2, "padding": 2},
     ConvGeometry(2, 14, 14, 64, 14, 14, (3, 3), dilation=(2, 2), padding=(2, 2))),
])
def test_match_conv_reads_window_strides_and_padding(shape, cout, window, options, geometry):
    found = match_conv(_legalized_conv(shape, cout, window, **options))
    assert found.conv == geometry
    assert (found.m, found.n, found.k) == (
        shape[0] * geometry.out_height * geometry.out_width, cout, window * window * shape[-1])
    assert not found.b_kn and [int(d) for d in found.b.shape] == [cout, window, window, shape[-1]]
    # a 1x1 stride-1 conv stays a plain GEMM
    assert match_gemm(_legalized_conv(shape, cout, 1)) is not None


def test_conv_segments_waste_least_of_each_output_row():
    def segment(width):
        return ConvGeometry(1, width, width, 64, width, width, (3, 3)).segment

    assert [segment(w) for w in (56, 28, 14, 7, 112)] == [8, 32, 16, 8, 16]
    geometry = ConvGeometry(32, 14, 14, 256, 14, 14, (3, 3), padding=(1, 1))
    # 14-pixel rows in 16-row segments, 9 taps x 4 steps of 64 channels
    assert (geometry.rows, geometry.k_steps) == (32 * 14 * 16, 36)


def test_match_conv_declines_what_tma_cannot_load():
    # channels not a multiple of 8: the input's rows are not 16-byte strides
    assert match_conv(_legalized_conv((2, 14, 14, 60), 32, 3, padding=1)) is None
    assert match_conv(_fused(64, 64, 64)) is None  # a GEMM, not a conv
    # zeros where the input is not, and only there: TMA's fill reproduces that padding alone
    for bound, fill in ((15, 0.0), (14, 0.0), (15, 1.0)):
        found = match_conv(_padded_by_hand(bound, fill))
        assert (found is not None) == (bound == 15 and fill == 0.0), (bound, fill)


def _padded_by_hand(bound: int, fill: float):
    """A 3x3 conv on 14x14 read through a padding block that keeps rows and columns of the
    input below ``bound`` (15: all of them) and is ``fill`` elsewhere."""
    x = te.placeholder((2, 14, 14, 64), "float16", name="X")
    w = te.placeholder((32, 3, 3, 64), "float16", name="W")
    padded = te.compute((2, 16, 16, 64), lambda b, h, v, c: tvm.tirx.if_then_else(
        tvm.tirx.all(h >= 1, h < bound, v >= 1, v < bound), x[b, h - 1, v - 1, c],
        tvm.tirx.const(fill, "float16")), name="pad_temp")
    ry, rx, rc = (te.reduce_axis((0, e), name) for e, name in ((3, "ry"), (3, "rx"), (64, "rc")))
    conv = te.compute((2, 14, 14, 32), lambda b, h, v, o: te.sum(
        padded[b, h + ry, v + rx, rc].astype("float32") * w[o, ry, rx, rc].astype("float32"),
        axis=[ry, rx, rc]), name="conv2d_nhwc")
    out = te.compute(conv.shape, lambda *i: conv[i].astype("float16"), name="out")
    return te.create_prim_func([x, w, out])


def test_match_conv_declines_taps_over_fewer_channels_than_a_step():
    # 16 channels a tap in steps of 64: three quarters zeros; mma.sync's steps run over taps
    # and channels together (the space-to-depth stem's 4x4 conv over 16 channels)
    assert match_conv(_legalized_conv((2, 14, 14, 16), 32, 3, padding=1)) is None
    assert match_conv(_legalized_conv((2, 14, 14, 64), 32, 3, padding=1)) is not None


@pytest.mark.parametrize("window,stride", [(1, 1), (3, 2)])
def test_residual_is_read_as_rows_one_vector_a_thread(window, stride, tmp_path):
    """A residual (a buffer of the output's size) is read through an [m, n] view of it, 16
    bytes a thread into registers, at the output's own address: not through each output
    row's position in N, H and W (64-bit divisions by H * W and W in every element's address,
    ResNet-50's residual 1x1 convs at a third of their memory roofline)."""
    func = _legalized_conv((4, 14, 14, 64), 96, window, stride=stride, padding=window // 2,
                           residual=True)
    found = match_gemm(func) if window == 1 else match_conv(func)
    assert found is not None
    source = _source(found.kernel())
    residual = [p.name for p in found.kernel().params][3]
    reads = [line for line in source.splitlines() if f"{residual}_ptr" in line
             and "__global__" not in line]
    assert any(f"*(uint4*)({residual}_ptr + " in line for line in reads)
    # 32-bit address arithmetic, the output's own (the old reads: 64-bit divisions and modulos)
    assert reads and not any("int64_t" in line for line in reads)
    nvcc_compiles(source, tmp_path, arch="sm_90a")


def test_conv_source_has_4d_tma_and_nvcc_compiles_it(tmp_path):
    found = match_conv(_legalized_conv((4, 28, 28, 128), 64, 3, padding=1))
    source = _source(found.kernel())
    assert "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes" in source
    assert "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes" in source
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in source
    nvcc_compiles(source, tmp_path, arch="sm_90a")


def test_conv_over_a_long_row_lowers_in_int32(tmp_path):
    """Wav2Vec2's second feature conv (a conv1d as a 1 x 3 conv, stride 2, 3199 -> 1599 pixels of
    512 channels): its output rows are divisions of the consumer warpgroup's row, which must be
    provably non-negative, or their lowering overflows int32 ("Literal value 17581191353856
    exceeds range of int32")."""
    geometry = ConvGeometry(1, 1, 3199, 512, 1, 1599, (1, 3), stride=(1, 2))
    source = _source(gemm_kernel(1599, 512, 3 * 512, conv=geometry, a_shape=(1, 1, 3199, 512),
                                 b_shape=(512, 1, 3, 512), c_shape=(1, 1, 1599, 512)))
    assert "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes" in source
    nvcc_compiles(source, tmp_path, arch="sm_90a")


def test_bf16_gemm_is_a_bf16_wgmma():
    found = match_gemm(_fused(256, 256, 64, dtype="bfloat16"), "bfloat16")
    assert found is not None
    tile = choose_wgmma_tile(256, 256)
    assert (f"wgmma.mma_async.sync.aligned.m64n{tile.block_n}k16.f32.bf16.bf16"
            in _source(found.kernel(tile)))


def test_match_declines_what_it_cannot_compute():
    assert match_gemm(_fused(64, 64, 68)) is None  # K not a multiple of 8: no TMA rows
    assert match_gemm(_fused(64, 64, 64, accumulate="float16")) is None  # summed in fp16
    a = te.placeholder((64, 64), "float16", name="A")
    out = te.compute((64, 64), lambda i, j: a[i, j] * 2, name="double")
    assert match_gemm(te.create_prim_func([a, out])) is None  # no matmul


@pytest.mark.parametrize("m,n,k", [(4096, 4096, 4096), (197, 1000, 72)])
def test_source_has_wgmma_tma_and_nvcc_compiles_it(tmp_path, m, n, k):
    bias = tvm.tirx.decl_buffer((n,), "float16", name="bias")
    source = _source(gemm_kernel(m, n, k, epilogue=lambda acc, row, col: T.Cast(
        "float16", acc + T.Cast("float32", bias[col])), extra=(bias,)))
    tile = choose_wgmma_tile(m, n, k_steps=-(-k // 64))
    assert f"wgmma.mma_async.sync.aligned.m64n{tile.block_n}k16.f32.f16.f16" in source
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes" in source
    assert "mbarrier.try_wait.parity" in source and "setmaxnreg.inc.sync.aligned.u32" in source
    # a producer warpgroup and the consumers; K = 72 is shallow: two blocks of one consumer
    threads, blocks = (384, 1) if k == 4096 else (256, 2)
    assert (tile.consumers + 1) * 128 == threads and tile.blocks_per_sm == blocks
    assert f"__launch_bounds__({threads}, {blocks})" in source
    nvcc_compiles(source, tmp_path, arch="sm_90a")


def test_tile_choice_fills_the_sms():
    # BERT-base b32's out projection: 32 x 3 blocks of 256 columns leave 36 of 132 SMs idle
    assert choose_wgmma_tile(4096, 768).block_n == 192
    assert choose_wgmma_tile(4096, 4096).block_n == 256
    # a 1x1 conv to 64 channels: 64-column tiles, not 256 of which 192 would be past N
    assert choose_wgmma_tile(32 * 56 * 56, 64).block_n == 64
    # a conv whose best tile is 64 wide: two blocks an SM of one consumer; wider ones keep two
    assert choose_wgmma_tile(32 * 7 * 8, 512, conv=True) == WgmmaTile(64, consumers=1,
                                                                       blocks_per_sm=2)
    assert choose_wgmma_tile(32 * 14 * 16, 256, conv=True) == WgmmaTile(128)
    # a shallow reduction (ResNet-50's 1x1 convs with K = 128 or 256): two blocks an SM of one
    # consumer, at most 128 columns; deeper ones keep the two-consumer tile
    assert choose_wgmma_tile(32 * 28 * 28, 512, k_steps=2) == WgmmaTile(128, consumers=1,
                                                                         blocks_per_sm=2)
    assert choose_wgmma_tile(32 * 56 * 56, 64, k_steps=4) == WgmmaTile(64, consumers=1,
                                                                       blocks_per_sm=2)
    assert choose_wgmma_tile(32 * 28 * 28, 512, k_steps=8) == WgmmaTile(256)
    with pytest.raises(ValueError, match="multiple of 16"):
        WgmmaTile(block_n=200).validate()
    with pytest.raises(ValueError, match="shared memory"):
        WgmmaTile(block_n=256, stages=6).validate()


def test_tile_registers_and_blocks_per_sm():
    # one block: two consumers at the most a thread may have, the producer at 40
    assert WgmmaTile().registers() == (232, 40)
    assert 128 * (2 * 232 + 40) <= 65536
    # two blocks of one consumer each: half the file apiece
    assert WgmmaTile(64, 4, consumers=1, blocks_per_sm=2).registers() == (216, 40)
    WgmmaTile(64, 4, consumers=1, blocks_per_sm=2).validate()
    with pytest.raises(ValueError, match="shared memory"):  # two blocks of 128 KB
        WgmmaTile(128, 4, blocks_per_sm=2).validate()
    with pytest.raises(ValueError, match="one or two"):
        WgmmaTile(64, blocks_per_sm=3).validate()
    # 128 accumulators over the 128 registers two blocks of 256 threads allow (ptxas refused
    # it on the H200: "register target of 154 or higher"); 96 fit (ran there)
    WgmmaTile(192, 3, consumers=1, blocks_per_sm=2).validate()
    with pytest.raises(ValueError, match="registers"):
        WgmmaTile(256, 2, consumers=1, blocks_per_sm=2).validate()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_pass_replaces_kernel_and_transposes_constant_weight(dtype):
    rng = np.random.default_rng(0)
    host = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    weight = rng.standard_normal((64, 200)).astype(host)  # [K, N]
    bias = rng.standard_normal(200).astype(host)
    def body(bb, x):
        gvar = bb.add_func(_fused(2048, 200, 64, dtype=dtype), "fused_gemm")
        return relax.call_tir(gvar, [x, relax.const(weight, dtype), relax.const(bias, dtype)],
                              relax.TensorType((2048, 200), dtype))

    before = relax_main({"x": (2048, 64)}, body, dtype)
    mod = UseWgmmaGemms(SM90A, min_k=64)(before)
    kernel = mod["fused_gemm"]
    assert kernel.attrs["tvmfuse.schedule"] == "cuda.wgmma_gemm"
    assert [int(d) for d in kernel.params[1].shape] == [200, 64]
    calls = []
    relax.analysis.post_order_visit(mod["main"], lambda e: calls.append(e) if isinstance(
        e, relax.Call) and isinstance(e.args[0], tvm.ir.GlobalVar) else None)
    np.testing.assert_array_equal(calls[0].args[1].fields[1].value.numpy(), weight.T)
    # too few rows for the wgmma kernel's 128-row blocks, or too short a K for its pipeline
    # (the default: K >= 128, or K >= 64 with 16384 rows or more): left to the schedule rules
    for declining in (UseWgmmaGemms(SM90A, min_rows=4096, min_k=64), UseWgmmaGemms(SM90A)):
        assert declining(before)["fused_gemm"].attrs.get("tvmfuse.schedule") is None
    taking = UseWgmmaGemms(SM90A, shallow_rows=2048)(before)
    assert taking["fused_gemm"].attrs["tvmfuse.schedule"] == "cuda.wgmma_gemm"


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (run on the GPU host)")
def test_conv_numbers_against_numpy():
    found = match_gemm(_conv(4, 28, 128, 64))
    lib = tvm.compile(tvm.IRModule({"main": found.kernel()}), target=SM90A, tir_pipeline="tirx")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 28, 28, 128)).astype("float16")
    w = rng.standard_normal((64, 1, 1, 128)).astype("float16")
    bias = rng.standard_normal((1, 1, 1, 64)).astype("float16")
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((4, 28, 28, 64), np.nan, "float16"), dev)
    lib["main"](*(tvm.runtime.tensor(v, dev) for v in (x, w, bias)), out)
    want = np.maximum(x.astype("float32") @ w[:, 0, 0, :].T.astype("float32")
                      + bias.astype("float32"), 0)
    got = out.numpy().astype("float32")
    assert np.isfinite(got).all(), "outputs left unwritten"
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (run on the GPU host)")
@pytest.mark.parametrize("shape,cout,window,options,dtype", [
    ((4, 28, 28, 128), 64, 3, {"padding": 1}, "float16"),  # 32-pixel segments, 4 past a row
    ((2, 56, 56, 64), 64, 3, {"padding": 1}, "float16"),  # 8-pixel segments, none past
    ((3, 14, 14, 256), 200, 3, {"stride": 2, "padding": 1}, "float16"),  # N no tile divides
    # strides (1, 2), asymmetric padding (72 channels: a second step of 64 reads zeros past
    # them; 40 channels, one step mostly zeros, is mma.sync's now: see
    # test_match_conv_declines_taps_over_fewer_channels_than_a_step)
    ((2, 15, 13, 72), 48, 3, {"stride": (1, 2), "padding": (1, 0, 1, 2)}, "float16"),
    ((2, 9, 9, 72), 64, 3, {"dilation": 2, "padding": 2}, "float16"),  # a half-full channel step
    ((2, 14, 14, 64), 96, 3, {"padding": 1}, "bfloat16"),
    # a ResNet downsample's strided 1x1 (with horizontal_conv off), shallow: two blocks an SM
    ((4, 28, 28, 256), 512, 1, {"stride": 2}, "float16"),
    # a residual read as rows (ResNet's blocks): 16-byte rows, and 100 columns (2-byte reads)
    ((3, 14, 14, 64), 96, 3, {"stride": 2, "padding": 1, "residual": True}, "float16"),
    ((2, 14, 14, 64), 100, 3, {"padding": 1, "residual": True}, "float16"),
])
def test_conv_numbers_against_torch(shape, cout, window, options, dtype):
    import torch  # noqa: PLC0415

    found = match_conv(_legalized_conv(shape, cout, window, **options, dtype=dtype), dtype)
    lib = tvm.compile(tvm.IRModule({"main": found.kernel()}), target=SM90A, tir_pipeline="tirx")
    rng = np.random.default_rng(sum(shape) + cout)
    store = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    x = rng.standard_normal(shape).astype(store)
    w = rng.standard_normal((cout, window, window, shape[-1])).astype(store)
    bias = rng.standard_normal((1, 1, 1, cout)).astype(store)
    geometry = found.conv
    out_shape = (shape[0], geometry.out_height, geometry.out_width, cout)
    res = (rng.standard_normal(out_shape).astype(store),) if options.get("residual") else ()
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, store), dev)
    lib["main"](*(tvm.runtime.tensor(v, dev) for v in (x, w, bias, *res)), out)
    padding = options.get("padding", 0)
    top, left, bottom, right = (padding,) * 4 if isinstance(padding, int) else padding
    padded = torch.nn.functional.pad(torch.tensor(x.astype("float32")).permute(0, 3, 1, 2),
                                     (left, right, top, bottom))
    conv = torch.nn.functional.conv2d(padded, torch.tensor(w.astype("float32")).permute(
        0, 3, 1, 2), stride=options.get("stride", 1), dilation=options.get("dilation", 1))
    want = conv.permute(0, 2, 3, 1).numpy() + bias.astype("float32")
    want = np.maximum(want + res[0].astype("float32") if res else want, 0)
    got = out.numpy().astype("float32")
    assert np.isfinite(got).all(), "outputs left unwritten"
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < (
        2e-3 if dtype == "float16" else 8e-3)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (run on the GPU host)")
@pytest.mark.parametrize("m,n,k,lead,dtype", [
    (4096, 768, 3072, (), "float16"), (1000, 1000, 1000, (), "float16"),
    (77, 100, 40, (), "float16"), (197, 2304, 768, (3,), "float16"),
    (1000, 1000, 1000, (), "bfloat16")])
def test_numbers_against_numpy(m, n, k, lead, dtype):
    found = match_gemm(_fused(m, n, k, lead=lead, dtype=dtype), dtype)
    lib = tvm.compile(tvm.IRModule({"main": found.kernel()}), target=SM90A, tir_pipeline="tirx")
    rng = np.random.default_rng(m + n + k)
    store = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    a, w = (rng.standard_normal(shape).astype(store) for shape in ((*lead, m, k), (k, n)))
    check_linear_gelu(lib, a, w, rng.standard_normal(n).astype(store), dtype)


def check_linear_gelu(lib, a, weight, bias, dtype):
    """Run ``lib`` (a kernel of :func:`_fused` with its weight read [N, K]) on ``a``,
    ``weight`` ([K, N], passed transposed) and ``bias`` on the GPU, every output first NaN, and
    check it against NumPy in float32."""
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((*a.shape[:-1], weight.shape[1]), np.nan, a.dtype), dev)
    lib["main"](*(tvm.runtime.tensor(x, dev) for x in (
        a, np.ascontiguousarray(weight.T), bias)), out)
    pre = a.astype("float32") @ weight.astype("float32") + bias.astype("float32")
    want = pre * 0.5 * (1 + np.vectorize(math.erf)(pre / np.sqrt(2)))
    got = out.numpy().astype("float32")
    assert np.isfinite(got).all(), "outputs left unwritten"
    # the output's rounding: 2^-11 relative for float16, 2^-8 for bfloat16
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < (
        2e-3 if dtype == "float16" else 8e-3)


def _relu6_module(m, n, k, weight, bias):
    """A fp16 linear layer + bias + ReLU6 as tvmfuse's fp16 builds fuse MobileNetV2's
    expansion convs: the pattern groups pass the clip's bounds as 0-d constants, parameters of
    the fused kernel (``maximum(y, param_2)``, ``minimum(.., param_3)``)."""
    a = te.placeholder((m, k), "float16", name="A")
    w = te.placeholder((k, n), "float16", name="W")
    b = te.placeholder((n,), "float16", name="bias")
    lo, hi = (te.placeholder((), "float16", name=name) for name in ("lo", "hi"))
    r = te.reduce_axis((0, k), "k")
    c = te.compute((m, n), lambda i, j: te.sum(
        a[i, r].astype("float32") * w[r, j].astype("float32"), axis=r), name="matmul")
    out = te.compute((m, n), lambda i, j: te.min(te.max(
        c[i, j].astype("float16") + b[j], lo()), hi()), name="out")
    kernel = te.create_prim_func([a, w, b, lo, hi, out])

    def body(bb, x):
        gvar = bb.add_func(kernel, "fused_gemm_relu6")
        return relax.call_tir(gvar, [x, relax.const(weight, "float16"),
                                     relax.const(bias, "float16"), relax.const(0, "float16"),
                                     relax.const(6, "float16")],
                              relax.TensorType((m, n), "float16"))

    return relax_main({"x": (m, k)}, body, "float16")


def _relu6_case(m=2048, n=192, k=160):
    rng = np.random.default_rng(6)
    weight = rng.standard_normal((k, n)).astype(np.float16)  # [K, N]
    bias = (rng.standard_normal(n) * 4).astype(np.float16)
    before = _relu6_module(m, n, k, weight, bias)
    (gvar,) = [g for g, f in before.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    after = UseWgmmaGemms(SM90A, min_k=64)(before)
    return before, after, gvar.name_hint, weight, bias


def test_zero_d_epilogue_parameters_are_passed_as_one_element(tmp_path):
    """A clip's 0-d bounds (TIRx's FlattenBuffer does not place 0-d parameters: MobileNetV2's
    fp16 b32 build failed with 'Buffer param_2 is used before its definition'): the kernel
    declares them as one element, the call passes them reshaped, and the source compiles."""
    before, after, name, _, _ = _relu6_case()
    assert sum(len(p.shape) == 0 for p in before[name].params) == 2
    kernel = after[name]
    assert kernel.attrs["tvmfuse.schedule"] == "cuda.wgmma_gemm"
    assert [len(p.shape) for p in kernel.params[3:5]] == [1, 1]
    calls = []
    relax.analysis.post_order_visit(after["main"], lambda e: calls.append(e) if isinstance(
        e, relax.Call) and isinstance(e.args[0], tvm.ir.GlobalVar) else None)
    bounds = [arg.value.numpy() for arg in calls[0].args[1].fields[3:5]]
    assert [b.shape for b in bounds] == [(1,), (1,)] and [float(b[0]) for b in bounds] == [0, 6]
    nvcc_compiles(_source(kernel.without_attr("target")), tmp_path, arch="sm_90a")


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (run on the GPU host)")
def test_zero_d_epilogue_parameters_numbers():
    _, after, name, weight, bias = _relu6_case()
    lib = tvm.compile(tvm.IRModule({"main": after[name].without_attr("target")}), target=SM90A,
                      tir_pipeline="tirx")
    a = np.random.default_rng(7).standard_normal((2048, weight.shape[0])).astype(np.float16)
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((2048, weight.shape[1]), np.nan, np.float16), dev)
    args = [a, np.ascontiguousarray(weight.T), bias, np.zeros(1, np.float16),
            np.full(1, 6, np.float16)]  # (the call passes the bounds reshaped so)
    lib["main"](*(tvm.runtime.tensor(x, dev) for x in args), out)
    pre = (a.astype("float32") @ weight.astype("float32")).astype(np.float16).astype(
        "float32") + bias.astype("float32")
    want = np.clip(pre, 0, 6)
    got = out.numpy().astype("float32")
    assert np.isfinite(got).all(), "outputs left unwritten"
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3
