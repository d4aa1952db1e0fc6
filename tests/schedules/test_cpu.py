"""The hand-written CPU schedules: which kernels each rule takes, the loop structure it gives
them, the instructions it gets from LLVM, and the numbers against PyTorch."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import tvm
from tvm import relax, s_tir, tirx

from tvmfuse import api
from tvmfuse.names import LAYOUT_REWRITE_PREPROC
from tvmfuse.schedules import cpu
from tvmfuse.targets import Vector
from tvmfuse.verify import verify

from conftest import HOST, relax_main

#: The schedules' structure is checked as AVX-512 lays it out on a core without a table of its
#: own (a Zen 5's GEMM tiles differ: test_full_width_cores_take_two_block_gemm_tiles), whichever
#: core runs the tests; the numbers run on this machine: the scheduled TIR is compiled for its
#: own target (LLVM splits a 16-lane vector for AVX2).
AVX512 = api.get_target("avx512")
VECTOR = Vector(AVX512.vector.lanes, AVX512.vector.registers)
RUN = api.get_target(HOST)
rng = np.random.default_rng(0)


def _kernel(inputs, body, legalize=None) -> tirx.PrimFunc:
    """The one fused PrimFunc that LegalizeOps (with ``legalize``'s overrides) + FuseOps +
    FuseTIR make of ``body``."""
    with AVX512.tvm_target():
        mod = relax.transform.LegalizeOps(legalize)(relax_main(dict(inputs), body))
        mod = relax.transform.AnnotateTIROpPattern()(mod)
        mod = relax.transform.FuseOps()(mod)
        mod = relax.transform.FuseTIR()(mod)
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    return func


def _run(sch: s_tir.Schedule, arrays: list[np.ndarray], out_shape) -> np.ndarray:
    func = sch.mod["main"].with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": func}), target=RUN.tvm_target())
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    out = tvm.runtime.tensor(np.zeros(out_shape, "float32"), dev)
    lib.mod["main"](*args, out)
    return out.numpy()


def _kinds(sch: s_tir.Schedule, block_name: str) -> list[str]:
    loops = sch.get_loops(sch.get_sblock(block_name))
    return [tirx.ForKind(int(sch.get(loop).kind)).name for loop in loops]


def _extents(sch: s_tir.Schedule, block_name: str) -> list[int]:
    return [int(sch.get(loop).extent) for loop in sch.get_loops(sch.get_sblock(block_name))]


def _close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


def _conv_relu(h, c, o, k, stride, groups=1):
    def body(bb, x, w, b):
        y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=k // 2, groups=groups,
                                       data_layout="NHWC", kernel_layout="HWIO"))
        return relax.op.nn.relu(bb.emit(relax.op.add(y, b)))

    return [("x", (1, h, h, c)), ("w", (k, k, c // groups, o)), ("b", (1, 1, 1, o))], body


def _torch_conv_relu(x, w, b, k, stride, groups=1):
    y = torch.nn.functional.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2),
                                   torch.from_numpy(w).permute(3, 2, 0, 1), stride=stride,
                                   padding=k // 2, groups=groups)
    return torch.relu(y + torch.from_numpy(b).reshape(1, -1, 1, 1)).permute(0, 2, 3, 1).numpy()


@pytest.mark.parametrize("h,c,o,k,stride", [(14, 32, 64, 3, 1), (16, 8, 32, 1, 2),
                                            (32, 3, 16, 7, 2)])
def test_conv2d_register_tile_and_numbers(h, c, o, k, stride):
    inputs, body = _conv_relu(h, c, o, k, stride)
    sch = cpu.Conv2D(VECTOR).apply(_kernel(inputs, body), AVX512.tvm_target(), False)
    assert sch is not None
    # parallel tiles, then the reduction, then rows x column-blocks (unrolled) x lanes
    kinds = _kinds(sch, "conv2d_nhwc_update")
    assert kinds[0] == "PARALLEL" and kinds[-1] == "VECTORIZED"
    assert kinds[-3:-1] == ["UNROLLED", "UNROLLED"]
    assert _extents(sch, "conv2d_nhwc_update")[-1] == 16
    script = sch.mod.script()
    assert 'scope="local"' in script  # the accumulators
    assert "T.max(" in script  # ReLU is applied to the tile, in the same kernel
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    out_h = (h + 2 * (k // 2) - k) // stride + 1
    _close(_run(sch, [x, w, b], (1, out_h, out_h, o)), _torch_conv_relu(x, w, b, k, stride))


@pytest.mark.parametrize("h,c,k,tile", [(5, 64, 3, [5, 4]), (10, 64, 3, [5, 4]),
                                        (7, 512, 3, [7, 2]), (7, 64, 3, [4, 4]),
                                        (14, 256, 1, [7, 2]), (28, 256, 1, [4, 4])])
def test_conv_tiles_divide_small_maps_and_keep_deep_weight_panels_in_the_l2(h, c, k, tile):
    """A conv's last row tile is predicated: over 5x5 and 10x10 maps 4-row tiles computed 8
    rows for every 5 (3x3 512 -> 512 over 5x5 ran 275 GFLOP/s, 5 x 4 463 on Zen 5), so a tile of
    five rows is taken. Over 7x7, 4 x 4 stays for 64 channels, but with 512 its weight panel
    (4608 deep x 64 columns, 1.2 MB) left the L2 on every row tile: 7 x 2 (32 columns) ran 498
    where 4 x 4 ran 383 (SPILLED_PANEL, now for convs as for GEMMs). A 1x1 conv over 14x14 takes
    7 x 2 (PREDICATED_POINTWISE: 1024 -> 256 ran 276 in 4 x 4, 490 in 7 x 2); over 28x28 4 x 4
    divides. Numbers against PyTorch."""
    inputs, body = _conv_relu(h, c, c, k, 1)
    sch = cpu.Conv2D(VECTOR).apply(_kernel(inputs, body), AVX512.tvm_target(), False)
    assert _extents(sch, "conv2d_nhwc_update")[-3:] == [*tile, 16]
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [x, w * 0.05, b], (1, h, h, c)), _torch_conv_relu(x, w * 0.05, b, k, 1))


def test_a_stem_pads_its_image_in_parallel_rows():
    """An RGB stem's padding copy runs a parallel loop over rows, the pixels and their three
    channels nested inside, not one parallel loop over every element (which divided its index
    three times per element: half of a 224 x 224 stem's time on a Zen 3)."""
    inputs, body = _conv_relu(64, 3, 32, 3, 2)
    sch = cpu.Conv2D(VECTOR).apply(_kernel(inputs, body), None, False)
    assert _kinds(sch, "pad_temp") == ["PARALLEL", "SERIAL", "SERIAL"]
    assert _extents(sch, "pad_temp") == [66, 66, 3]
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [x, w, b], (1, 32, 32, 32)), _torch_conv_relu(x, w, b, 3, 2))


def test_depthwise_conv2d_vectorizes_channels():
    inputs, body = _conv_relu(28, 48, 48, 3, 2, groups=48)
    func = _kernel(inputs, body)
    assert cpu.Conv2D(VECTOR).apply(func, None, False) is None  # not a dense conv
    sch = cpu.DepthwiseConv2D(VECTOR).apply(func, None, False)
    kinds = _kinds(sch, "group_conv2d_nhwc_update")
    assert kinds[0] == "PARALLEL" and kinds[-1] == "VECTORIZED"
    assert "pad_temp" not in [b.name_hint for b in _blocks(sch)]  # strided: read through it
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [x, w, b], (1, 14, 14, 48)), _torch_conv_relu(x, w, b, 3, 2, groups=48))


@pytest.mark.parametrize("channels,rows_outer", [(96, True), (672, False)])
def test_depthwise_threads_split_rows_where_the_channels_are_few_tiles(channels, rows_outer):
    """Over 96 channels (two column tiles) the depthwise conv's threads take rows, each whole
    pixels (column tiles outermost, each wrote part of every pixel: 58-75 us against 31-35 on
    two Zen 4 threads); over 672 (six tiles) the column tiles stay outermost."""
    inputs, body = _conv_relu(14, channels, channels, 3, 1, groups=channels)
    sch = cpu.DepthwiseConv2D(VECTOR).apply(_kernel(inputs, body), None, False)
    (parallel,) = [loop for loop in sch.get_loops(sch.get_sblock("group_conv2d_nhwc_update"))
                   if sch.get(loop).kind == tirx.ForKind.PARALLEL]
    fused = sch.get(parallel).loop_var.name
    assert fused.endswith("_ff_0_fused") == rows_outer, fused
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [x, w, b], (1, 14, 14, channels)),
           _torch_conv_relu(x, w, b, 3, 1, groups=channels))


def test_a_conv_of_no_padding_reads_its_input_without_copying_it():
    """A depthwise conv whose input was padded beforehand (PadConvChannels: 77 channels to 80,
    the spatial padding in the same copy) has ``padding=0``, and TVM's legalization still copies
    the input into ``pad_temp``: the copy is inlined, not run as a second pass over the input."""
    def body(bb, x, w, b):
        y = bb.emit(relax.op.nn.conv2d(x, w, padding=0, groups=80, data_layout="NHWC",
                                       kernel_layout="HWIO"))
        y = bb.emit(relax.op.strided_slice(y, axes=[3], begin=[0], end=[77]))
        return relax.op.nn.relu(bb.emit(relax.op.add(y, b)))

    inputs = [("x", (1, 16, 16, 80)), ("w", (3, 3, 1, 80)), ("b", (1, 1, 1, 77))]
    sch = cpu.DepthwiseConv2D(VECTOR).apply(_kernel(inputs, body), None, False)
    assert "pad_temp" not in [b.name_hint for b in _blocks(sch)]
    assert _kinds(sch, "group_conv2d_nhwc_update")[-1] == "VECTORIZED"
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    y = torch.nn.functional.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2),
                                   torch.from_numpy(w).permute(3, 2, 0, 1), groups=80)
    expected = torch.relu(y.permute(0, 2, 3, 1)[..., :77] + torch.from_numpy(b)).numpy()
    _close(_run(sch, [x, w, b], (1, 14, 14, 77)), expected)


def test_grouped_conv2d_vectors_stay_within_a_group():
    # RegNet's 8-channel groups on 48 channels: a 16-lane vector would read two groups' inputs
    inputs, body = _conv_relu(14, 48, 48, 3, 1, groups=6)
    sch = cpu.DepthwiseConv2D(VECTOR).apply(_kernel(inputs, body), None, False)
    assert _kinds(sch, "group_conv2d_nhwc_update")[-1] == "VECTORIZED"
    assert _extents(sch, "group_conv2d_nhwc_update")[-1] == 8
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [x, w, b], (1, 14, 14, 48)), _torch_conv_relu(x, w, b, 3, 1, groups=6))


def _matmul_bias_relu(bb, x, w, b):
    """``relu(x @ w + b)``: a GEMM over whatever leading axes ``x`` has, with its epilogue."""
    return relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w)), b)))


def test_dense_over_a_feature_map_tiles_all_its_rows_at_once():
    # ConvNeXt's pointwise layers: [1, 14, 14, 384] @ [384, 1536] is one GEMM of 196 rows
    inputs = [("x", (1, 14, 14, 64)), ("w", (64, 128)), ("b", (128,))]
    sch = cpu.Dense(VECTOR).apply(_kernel(inputs, _matmul_bias_relu), None, False)
    # parallel over 2 column tiles x 49 tiles of 4 rows (of 14 rows: 2 x 14 x 4 tiles, a
    # quarter of the last one empty), then the reduction, then the 4 x 4 vectors
    assert _extents(sch, "matmul_update") == [2 * 49, 64, 4, 4, 16]
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [x, w, b], (1, 14, 14, 128)), np.maximum(x @ w + b, 0))


def test_dense_over_a_feature_map_on_avx2_takes_a_tile_that_divides_its_rows():
    """Merged rows are not padded (their last tile predicated): on AVX2 the GEMM's six-row tile
    over 196 rows kept every tile's accumulators in memory (ConvNeXt on a Zen 3: 63 -> 113 ms);
    a tile whose rows divide 196 is taken instead, and the numbers hold."""
    avx2 = api.get_target("avx2")
    inputs = [("x", (1, 14, 14, 64)), ("w", (64, 128)), ("b", (128,))]
    sch = cpu.Dense(avx2.vector).apply(_kernel(inputs, _matmul_bias_relu), avx2.tvm_target(),
                                       False)
    rows = _extents(sch, "matmul_update")[-3]
    assert 196 % rows == 0 and rows > 1
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [x, w, b], (1, 14, 14, 128)), np.maximum(x @ w + b, 0))


def test_dense_over_a_7x7_map_takes_a_tile_whose_rows_divide_49():
    """ConvNeXt's last stage: [1, 7, 7, C] @ [C, N] is one GEMM of 49 rows, which no tile of
    4 rows (nor the padded 3 x 7) divides, so the last tile was predicated and every tile kept
    its accumulators in memory (49 x 768 x 3072 + GELU on Zen 4: 128 GFLOP/s); 7 x 3 ran it
    at 223-233."""
    inputs = [("x", (1, 7, 7, 64)), ("w", (64, 96)), ("b", (96,))]
    sch = cpu.Dense(VECTOR).apply(_kernel(inputs, _matmul_bias_relu), None, False)
    # parallel over 2 column tiles x 7 row tiles, the reduction, 7 rows x 3 vectors of 16
    assert _extents(sch, "matmul_update") == [2 * 7, 64, 7, 3, 16]
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [x, w, b], (1, 7, 7, 96)), np.maximum(x @ w + b, 0))


def test_a_zen5_gemm_over_49_rows_takes_a_tile_that_divides_them():
    """Winograd's batched GEMMs over a 14x14 map have 49 rows (7x7 tiles): on Zen 5 they were
    padded to 52 in 4 x 4 tiles (a copy of the input, a predicated output); 7 x 2 divides them
    (49 x 256 x 256: 377 -> 428 GFLOP/s; 3x3 convs over 14x14 through Winograd 626-883 ->
    823-1007, DIVIDING_GEMM_ROWS). 196 rows keep 4 x 4, and so do 49 on a Zen 4."""
    from tvmfuse.schedules.cpu._tiles import Tile, choose_tile
    from tvmfuse.targets import Vector

    zen5 = Vector(lanes=16, registers=32, core="znver5")
    assert choose_tile(49, 256, zen5, tall=True, depth=256) == Tile(7, 2, 16)
    assert choose_tile(196, 256, zen5, tall=True, depth=256) == Tile(4, 4, 16)
    zen4 = Vector(lanes=16, registers=32, core="znver4")
    assert choose_tile(49, 256, zen4, tall=True, depth=256) == Tile(4, 4, 16)
    inputs = [("x", (4, 49, 64)), ("w", (4, 64, 96))]
    sch = cpu.Dense(zen5).apply(_kernel(inputs, lambda bb, x, w: relax.op.matmul(x, w)), None,
                                False)
    assert _extents(sch, "matmul_update")[-3:] == [7, 2, 16]
    assert "_pad" not in sch.mod.script()  # no padded rows
    x, w = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [x, w], (4, 49, 96)), x @ w)


def test_dense_over_50_rows_takes_a_tile_that_divides_them_over_one_that_pads():
    """CLIP's and DistilBERT's 50 tokens: 4 x 4 tiles over rows padded to 52 ran their GEMMs at
    165-198 GFLOP/s on Zen 4, 5 x 3 tiles (dividing 50) at 212-222 (PADDED_ROWS_32)."""
    inputs, body = _dense(50, 64, 192, lambda y: y)
    sch = cpu.Dense(VECTOR).apply(_kernel(inputs, body), None, False)
    assert _extents(sch, "matmul_update")[-3:] == [5, 3, 16]
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [x, w, b], (1, 50, 192)), x @ w + b)


def _blocks(sch):
    return [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]


def _dense(m, k, n, epilogue):
    def body(bb, x, w, b):
        y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w)), b))
        return epilogue(y)

    return [("x", (1, m, k)), ("w", (k, n)), ("b", (n,))], body


def test_dense_gelu_numbers_and_zmm_fmas():
    inputs, body = _dense(24, 64, 96, relax.op.nn.gelu)
    func = _kernel(inputs, body)
    sch = cpu.Dense(VECTOR).apply(func, None, False)
    assert sch is not None and "erf" in sch.mod.script()
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    expected = torch.nn.functional.gelu(torch.from_numpy(x) @ torch.from_numpy(w)
                                        + torch.from_numpy(b)).numpy()
    _close(_run(sch, [x, w, b], (1, 24, 96)), expected)
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}),
                      target=AVX512.tvm_target())
    asm = lib.mod.inspect_source("asm")
    fmas = [line for line in asm.splitlines() if "vfmadd" in line and "%zmm" in line]
    rows, blocks, _ = _extents(sch, "matmul_update")[-3:]
    assert len(fmas) >= rows * blocks, "the hot loop should be AVX-512 FMAs on zmm registers"


def _packing(sch) -> list:
    return [b for b in _blocks(sch) if LAYOUT_REWRITE_PREPROC in b.annotations]


@pytest.mark.parametrize("kind", ["dense", "conv"])
def test_layout_free_weights_are_read_in_panels_of_the_register_tile(kind):
    if kind == "dense":
        inputs, body = _dense(24, 64, 128, relax.op.nn.relu)
        rule, anchor, out_shape = cpu.Dense(VECTOR), "matmul_update", (1, 24, 128)
    else:
        inputs, body = _conv_relu(14, 32, 128, 3, 1)
        rule, anchor, out_shape = cpu.Conv2D(VECTOR), "conv2d_nhwc_update", (1, 14, 14, 128)
    func = _kernel(inputs, body)
    assert not _packing(rule.apply(func, AVX512.tvm_target(), False))  # weights not marked
    sch = rule.apply(func.with_attr("layout_free_buffers", [1]), AVX512.tvm_target(), False)
    (packing,) = _packing(sch)
    # the weight [k..., 128] is read as [128 / panel, k..., panel], a panel being the tile's
    # columns: 4 blocks of 16 lanes, the 4x4 tile of both (the conv's 14 output columns are
    # rows of 4 with a predicated tail: 14 of 16 accumulators busy, as in a 7x2 tile, with
    # twice the blocks per broadcast)
    weight_shape = dict(inputs)["w"]
    packed = packing.writes[0].source
    panel = 64
    assert [int(d) for d in packed.ty.shape] == [128 // panel, *weight_shape[:-1], panel]
    assert any(r.source.same_as(packed) for r in sch.get(sch.get_sblock(anchor)).reads)
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    if kind == "dense":
        expected = np.maximum(x @ w + b, 0)
    else:
        expected = _torch_conv_relu(x, w, b, 3, 1)
    _close(_run(sch, [x, w, b], out_shape), expected)


def test_dense_rejects_what_it_cannot_vectorize():
    inputs, body = _dense(8, 16, 3, lambda y: y)  # three columns: no vector of 4 or more
    assert cpu.Dense(VECTOR).apply(_kernel(inputs, body), None, False) is None
    conv_inputs, conv_body = _conv_relu(8, 16, 16, 3, 1)
    assert cpu.Dense(VECTOR).apply(_kernel(conv_inputs, conv_body), None, False) is None


@pytest.mark.parametrize("vector,tile", [
    (Vector(16, 32), (4, 4)),  # AVX-512: 16 accumulators of 16 lanes
    (Vector(4, 16), (2, 4)),  # SSE: 16 registers, 8 accumulators (ties: more column blocks)
])
def test_register_tile_fits_the_register_file(vector, tile):
    from tvmfuse.schedules.cpu._tiles import choose_tile

    chosen = choose_tile(56, 256, vector)
    assert (chosen.rows, chosen.blocks) == tile
    # a GEMM's tile in 16 registers: 12 accumulators, 6 rows of two blocks (AVX2 and SSE);
    # where six rows pad much, five (49 or 50 rows: 5 x 2 ran 183-191 GFLOP/s where 6 x 2 over
    # 54 rows ran 173-176, FILL_EXPONENT_16)
    for sixteen in (Vector(8, 16), Vector(4, 16)):
        gemm = choose_tile(60, 256, sixteen, tall=True)
        assert (gemm.rows, gemm.blocks) == (6, 2)
        assert (choose_tile(197, 256, sixteen, tall=True).rows, choose_tile(
            49, 256, sixteen, tall=True).rows, choose_tile(50, 256, sixteen, tall=True).rows) == (
            6, 5, 5)
    assert choose_tile(56, 256, Vector(16, 32), tall=True) == choose_tile(56, 256,
                                                                          Vector(16, 32))
    assert chosen.rows * chosen.blocks + chosen.blocks + 1 <= vector.registers
    assert choose_tile(7, 32, Vector(16, 32)).rows == 7  # 7x7 maps: rows divide the width


def test_deep_gemm_tiles_keep_their_weight_panel_in_the_l2(tmp_path):
    """ViT's FFN2 (197 x 3072 -> 768): the 3 x 7 tile over padded columns (112 wide) reads a
    1.4 MiB weight panel per row tile, past a 1 MiB L2 (299 GFLOP/s on Zen 5 where 4 x 4, 835 KiB
    with its input rows, ran 436); at BERT's depth 768 it stays the choice. A GEMM's numbers in
    the chosen tile at depth 3072."""
    from tvmfuse.schedules.cpu._tiles import Tile, choose_tile

    avx512 = Vector(16, 32)
    assert choose_tile(197, 768, avx512, tall=True, pad=True, depth=768) == Tile(3, 7, 16)
    for depth in (2048, 3072):
        assert choose_tile(197, 768, avx512, tall=True, pad=True, depth=depth) == Tile(4, 4, 16)
        assert choose_tile(197, 768, avx512, tall=True, depth=depth) == Tile(4, 4, 16)
    torch.manual_seed(0)
    model = api.import_torch(torch.nn.Linear(3072, 200).eval(), [torch.randn(1, 37, 3072)])
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions(use_database=False))
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-5


def test_the_weight_panel_budget_is_1_mib_on_cores_of_up_to_2_mib_l2():
    """The budget SPILLED_PANEL was fitted with stays 1 MiB on the cores of 512 KiB to 2 MiB of
    L2 that chose today's tiles; a larger L2 gives the panel half of it."""
    from tvmfuse.schedules.cpu._tiles import panel_budget
    from tvmfuse.targets import avx512_for

    for core in ("znver4", "znver5", "emeraldrapids"):
        assert panel_budget(avx512_for(core).vector) == 1 << 20
    assert panel_budget(Vector(8, 16, l2_bytes=512 << 10)) == 1 << 20
    assert panel_budget(Vector(16, 32, l2_bytes=4 << 20)) == 2 << 20


def test_full_width_cores_take_two_block_gemm_tiles():
    """On Zen 5 (full-width 512-bit FMAs) a GEMM's 8 x 2 tile ran 2-9% faster than the 4 x 4 and
    padded 3 x 7 that Zen 4's table picks (BLOCK_EFFICIENCY_FULL_WIDTH); rows that eight pad
    much keep the tile that fits them; convs and other cores keep their tiles."""
    from tvmfuse.schedules.cpu._tiles import Tile, choose_tile

    zen5, zen4 = Vector(16, 32, "znver5"), Vector(16, 32, "znver4")
    for cols, depth in ((768, 768), (2304, 768), (3072, 768), (768, 3072)):
        assert choose_tile(197, cols, zen5, tall=True, pad=True, depth=depth) == Tile(8, 2, 16)
    assert choose_tile(197, 768, zen4, tall=True, pad=True, depth=768) == Tile(3, 7, 16)
    assert choose_tile(50, 768, zen5, tall=True, pad=True, depth=768) == Tile(5, 3, 16)
    assert choose_tile(56, 256, zen5) == choose_tile(56, 256, zen4)  # a conv's


def test_intel_server_cores_take_ten_row_two_block_gemm_tiles():
    """On Emerald Rapids a GEMM's 10 x 2 tile ran 2-6% faster than the 5 x 3 (50 rows) and
    4 x 4 (77, 197 rows) that the other tables pick (BLOCK_EFFICIENCY_INTEL); 128 rows, which
    4 divides, keep 4 x 4; convs keep their tiles. A GEMM's numbers in the 10 x 2 tile."""
    from tvmfuse.schedules.cpu._tiles import Tile, choose_tile

    emr, zen4 = Vector(16, 32, "emeraldrapids"), Vector(16, 32, "znver4")
    for rows in (50, 77, 197):
        for cols, depth in ((768, 768), (3072, 768), (768, 3072)):
            assert choose_tile(rows, cols, emr, tall=True, pad=True, depth=depth) == Tile(10, 2, 16)
    assert choose_tile(128, 768, emr, tall=True, pad=True, depth=768) == Tile(4, 4, 16)
    assert choose_tile(50, 768, zen4, tall=True, pad=True, depth=768) == Tile(5, 3, 16)
    assert choose_tile(56, 256, emr) == choose_tile(56, 256, zen4)  # a conv's
    inputs, body = _dense(50, 64, 96, lambda y: y)
    sch = cpu.Dense(emr).apply(_kernel(inputs, body), None, False)
    assert _extents(sch, "matmul_update")[-3:] == [10, 2, 16]
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [x, w, b], (1, 50, 96)), x @ w + b)


def test_sixteen_register_tiles_reuse_their_weights_and_divide_the_rows():
    """In 16 registers a tile of several blocks fits one row (each weight vector used once) and
    is taken only where the output has one row; a tile's rows divide a conv's (which are not
    padded) where that keeps 3/4 of them; numbers of RegNet's 1x1 conv on 28x28 in that tile."""
    from tvmfuse.schedules.cpu._tiles import Tile, choose_tile

    avx2 = Vector(8, 16)
    assert choose_tile(7, 440, avx2) == Tile(7, 1, 8)  # not 1 x 5
    assert choose_tile(28, 104, avx2) == Tile(7, 1, 8)  # not 8 x 1: 28 = 3 x 8 + 4
    assert choose_tile(1, 440, avx2).rows == 1
    assert choose_tile(14, 64, avx2).rows == 2  # 4 x 2 would leave 14 = 3 x 4 + 2
    assert choose_tile(197, 104, avx2) == Tile(8, 1, 8)  # no divisor near 8: predicated
    # a GEMM's rows are padded (12 rows where they divide), or a shorter tile pads fewer
    assert choose_tile(36, 104, avx2, tall=True).rows == 12
    assert choose_tile(28, 104, avx2, tall=True).rows == 7
    inputs, body = _conv_relu(28, 104, 104, 1, 1)
    sch = cpu.Conv2D(avx2).apply(_kernel(inputs, body), None, False)
    assert _extents(sch, "conv2d_nhwc_update")[-3:] == [7, 1, 8]
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [x, w, b], (1, 28, 28, 104)), _torch_conv_relu(x, w, b, 1, 1))


def test_pool_and_mean():
    def body(bb, x):
        pooled = bb.emit(relax.op.nn.max_pool2d(x, 3, 2, 1, layout="NHWC"))
        return relax.op.nn.relu(pooled)

    x = rng.standard_normal((1, 16, 16, 32)).astype("float32")
    sch = cpu.Pool(VECTOR).apply(_kernel([("x", x.shape)], body), None, False)
    expected = torch.relu(torch.nn.functional.max_pool2d(
        torch.from_numpy(x).permute(0, 3, 1, 2), 3, 2, 1)).permute(0, 2, 3, 1).numpy()
    _close(_run(sch, [x], (1, 8, 8, 32)), expected)
    mean = _kernel([("x", (1, 7, 7, 64))], lambda bb, x: relax.op.mean(x, axis=[1, 2]))
    sch = cpu.Pool(VECTOR).apply(mean, None, False)
    y = rng.standard_normal((1, 7, 7, 64)).astype("float32")
    _close(_run(sch, [y], (1, 64)), y.mean(axis=(1, 2)))


def test_softmax_and_layer_norm_one_row_per_thread():
    x = rng.standard_normal((4, 64, 128)).astype("float32")  # big enough for threads
    softmax = _kernel([("x", x.shape)], lambda bb, x: relax.op.nn.softmax(x))
    sch = cpu.RowReduction(VECTOR).apply(softmax, None, False)
    # every block runs inside the parallel loop over rows
    for block in _blocks(sch):
        assert _kinds(sch, block.name_hint)[0] == "PARALLEL"
    _close(_run(sch, [x], x.shape), torch.softmax(torch.from_numpy(x), -1).numpy())
    g, b = rng.standard_normal(128).astype("float32"), rng.standard_normal(128).astype("float32")
    ln = _kernel([("x", x.shape), ("g", (128,)), ("b", (128,))],
                 lambda bb, x, g, b: relax.op.nn.layer_norm(x, g, b, axes=[-1]))
    sch = cpu.RowReduction(VECTOR).apply(ln, None, False)
    expected = torch.nn.functional.layer_norm(torch.from_numpy(x), (128,), torch.from_numpy(g),
                                              torch.from_numpy(b)).numpy()
    _close(_run(sch, [x, g, b], x.shape), expected)
    for k, n in ((32, 16), (16, 16)):  # its reduction is over K, not a row, even where K = N
        matmul = _kernel(*_dense(8, k, n, lambda y: y))
        assert cpu.RowReduction(VECTOR).apply(matmul, None, False) is None


ROW_OPS = {
    "layer_norm": (lambda bb, x, w, b: relax.op.nn.layer_norm(x, w, b, axes=[-1]),
                   lambda x, w, b: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b)),
    "rms_norm": (lambda bb, x, w, b: relax.op.nn.rms_norm(x, w, axes=[-1]),
                 lambda x, w, b: torch.nn.functional.rms_norm(x, x.shape[-1:], w, eps=1e-5)),
    "softmax": (lambda bb, x, w, b: relax.op.nn.softmax(x),
                lambda x, w, b: torch.softmax(x, -1)),
}


@pytest.mark.parametrize("op", ROW_OPS)
@pytest.mark.parametrize("n", [33, 77, 197, 1000, 1024])
def test_row_reductions_reduce_in_whole_vectors_then_fold_the_lanes(op, n):
    """Rows of any length are reduced into vector accumulators, 16 lanes a step (the last vector
    the row's last 16 elements, lanes counted already weighing nothing; one, two or four
    accumulators by the row's length), then folded 16 -> 8 -> 4 -> 2 -> 1 in vector operations,
    not a serial chain across the lanes; the output in whole vectors and a tail in narrower ones;
    numbers against PyTorch, rows offset so that reading past one would read the next."""
    from tvmfuse.strategy import whole_vectors

    body, reference = ROW_OPS[op]
    x = (rng.standard_normal((3, 7, n)) * 3 + np.arange(21).reshape(3, 7, 1)).astype("float32")
    w, b = (rng.standard_normal(n).astype("float32") for _ in range(2))
    func = _kernel([("x", x.shape), ("w", (n,)), ("b", (n,))], body,
                   whole_vectors.legalizations(VECTOR.lanes))
    sch = cpu.RowReduction(VECTOR).apply(func, None, False)
    assert sch is not None
    names = re.findall(r'T.sblock\("(\w+)"\)', sch.mod.script())
    reductions = [name.removesuffix("_lanes_init") for name in names
                  if name.endswith("_lanes_init")]
    assert len(reductions) == (2 if op != "rms_norm" else 1)
    steps = -(-n // 16)
    accumulators = 4 if steps >= 8 else 2 if steps >= 4 else 1
    outer = -(-steps // accumulators)
    masked = n % 16 or steps % accumulators
    for reduction in reductions:  # vectors of accumulators, the padded row's steps around them
        updates = [name for name in names if re.fullmatch(rf"{reduction}_lanes_update(_ax\d+)?",
                                                          name)]
        # a row that is not whole steps of whole vectors: its last step (the one reading the
        # row's last vector, lanes masked) runs apart, the others without the masks
        assert [_extents(sch, u)[-2 if accumulators == 1 else -3] for u in updates] == (
            [outer - 1, 1] if masked and outer > 1 else [outer])
        for name in updates:
            assert _kinds(sch, name)[-1] == "VECTORIZED" and _extents(sch, name)[-1] == 16
            if accumulators > 1:
                assert _kinds(sch, name)[-2] == "UNROLLED"
                assert _extents(sch, name)[-2] == accumulators
        folds = [f"{reduction}_fold{width}_update" for width in (8, 4, 2)]
        assert set(folds) <= set(names)
        for fold in folds:  # each a vector operation on two halves
            assert _kinds(sch, fold)[-2:] == ["SERIAL", "VECTORIZED"]
            assert _extents(sch, fold)[-2] == 2
    # the output in whole vectors, then the rest of the row in narrower ones (13: 8 + 4 + 1)
    output = func.params[-1].name  # the block that writes it has its name
    if n % 16:
        whole, *tail = re.findall(rf'T.sblock\("({output}_\w+\d)"\)', sch.mod.script())
        assert _kinds(sch, whole)[-1] == "VECTORIZED" and _extents(sch, whole)[-1] == 16
        widths = [1 << bit for bit in range(4, -1, -1) if n % 16 >> bit & 1]
        assert [_extents(sch, piece)[-1] for piece in tail] == widths
        assert [_kinds(sch, piece)[-1] for piece in tail] == [
            "VECTORIZED" if width > 1 else "SERIAL" for width in widths]
    else:  # a row of whole vectors reads no padding: no clamp, no select
        assert "T.Select" not in sch.mod.script() and "T.min" not in sch.mod.script()
    want = reference(*(torch.from_numpy(a) for a in (x, w, b))).numpy()
    _close(_run(sch, [x, w, b] if op == "layer_norm" else [x, w] if op == "rms_norm" else [x],
                x.shape), want)


@pytest.mark.parametrize("op", ["layer_norm", "softmax"])
def test_short_rows_are_reduced_four_at_a_time(op):
    """Rows of fewer than eight vectors are reduced in groups of four (``ROW_GROUP``): each step
    of the partial results and of their combination is taken for the group's four rows in turn
    (unrolled, under the step), so that their dependent chains overlap; 45 rows are 11 groups and
    one of a single row, which lowering runs apart (PART_TAIL). Rows of 13 vectors stay one at a
    time. Numbers against PyTorch."""
    from tvmfuse.names import PART_TAIL
    from tvmfuse.schedules.cpu.reduction import ROW_GROUP
    from tvmfuse.strategy import whole_vectors

    body, reference = ROW_OPS[op]
    for n, grouped in ((77, True), (197, False)):
        x = (rng.standard_normal((1, 45, n)) * 3 + np.arange(45).reshape(1, 45, 1)).astype(
            "float32")
        w, b = (rng.standard_normal(n).astype("float32") for _ in range(2))
        func = _kernel([("x", x.shape), ("w", (n,)), ("b", (n,))], body,
                       whole_vectors.legalizations(VECTOR.lanes))
        sch = cpu.RowReduction(VECTOR).apply(func, None, False)
        names = [name for name in re.findall(r'T.sblock\("(\w+)"\)', sch.mod.script())
                 if re.fullmatch(r"\w+_lanes_update(_ax\d+)?", name)]
        assert names
        for name in names:
            kinds, extents = _kinds(sch, name), _extents(sch, name)
            if grouped:  # (group,) step, its rows, accumulators, lanes
                assert kinds[-3:] == ["UNROLLED", "UNROLLED", "VECTORIZED"]
                assert extents[-3:] == [ROW_GROUP, 2, 16]
            else:  # (row,) step, accumulators, lanes
                assert kinds[-2:] == ["UNROLLED", "VECTORIZED"] and extents[-3] != ROW_GROUP
        init = names[0].split("_lanes_update")[0] + "_lanes_init"
        rows = sch.get(sch.get_loops(sch.get_sblock(init))[0])
        assert int(rows.extent) == (12 if grouped else 45)
        assert (int(rows.annotations[PART_TAIL]) if PART_TAIL in rows.annotations
                else None) == (11 if grouped else None)
        want = reference(*(torch.from_numpy(a) for a in (x, w, b))).numpy()
        _close(_run(sch, [x, w, b] if op == "layer_norm" else [x], x.shape), want)


def test_many_short_rows_of_several_dimensions_parallel_one_row_at_a_time():
    """DeBERTa's softmax over [1, 12, 93, 93]: rows of two dimensions in groups of four fail
    TVM's check when the group loop is made parallel; the rows are then reduced one at a time
    (not left to the generic elementwise schedule). Numbers against PyTorch."""
    from tvmfuse.strategy import whole_vectors

    body, reference = ROW_OPS["softmax"]
    x = (rng.standard_normal((1, 12, 93, 93)) * 3).astype("float32")
    func = _kernel([("x", x.shape), ("w", (93,)), ("b", (93,))], body,
                   whole_vectors.legalizations(VECTOR.lanes))
    sch = cpu.RowReduction(VECTOR).apply(func, None, False)
    assert sch is not None
    init = [n for n in re.findall(r'T.sblock\("(\w+)"\)', sch.mod.script())
            if n.endswith("_lanes_init")][0]
    rows = sch.get_loops(sch.get_sblock(init))[0]
    assert int(sch.get(rows).extent) == 12 * 93 and _kinds(sch, init)[0] == "PARALLEL"
    _close(_run(sch, [x], x.shape), reference(torch.from_numpy(x), None, None).numpy())


def test_a_gemm_over_an_activation_no_tile_divides_pads_it_per_call():
    """DeBERTa's attention scores, 12 x (93 x 64 by 64 x 93) plus its relative-position bias:
    93 columns that no vector divides, read from an activation (no weight to pad at build
    time). The operand is copied zero-padded to whole tiles on each call and the GEMM
    register-blocked (it ran at 6 GFLOP/s on the generic schedule). Numbers against NumPy."""
    inputs = [("q", (12, 93, 64)), ("k", (12, 64, 93)), ("bias", (12, 93, 93))]
    func = _kernel(inputs, lambda bb, q, k, bias: relax.op.add(
        bb.emit(relax.op.matmul(q, k)), bias))
    sch = cpu.Dense(VECTOR).apply(func, None, False)
    assert sch is not None
    assert _kinds(sch, "matmul_update")[-1] == "VECTORIZED"
    assert _extents(sch, "matmul_update")[-1] == 16
    q, k, bias = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [q, k, bias], (12, 93, 93)), q @ k + bias)


def test_rows_under_two_vectors_keep_tvm_legalization():
    from tvmfuse.strategy import whole_vectors

    body, _ = ROW_OPS["layer_norm"]
    inputs = [("x", (4, 24)), ("w", (24,)), ("b", (24,))]
    ours = _kernel(inputs, body, whole_vectors.legalizations(VECTOR.lanes))
    tvm.ir.assert_structural_equal(ours, _kernel(inputs, body))


class LinearAddNorm(torch.nn.Module):
    """BERT's attention output: LayerNorm(x @ W + b + residual)."""

    def __init__(self, k: int, n: int):
        super().__init__()
        self.linear, self.norm = torch.nn.Linear(k, n), torch.nn.LayerNorm(n)

    def forward(self, x, residual):
        return self.norm(self.linear(x) + residual)


def test_dense_row_norm_splits_the_gemm_by_column_tiles_then_normalizes_the_rows():
    torch.manual_seed(0)
    module = LinearAddNorm(48, 64).eval()
    x, residual = torch.randn(1, 32, 48), torch.randn(1, 32, 64)
    fused, _ = api.analyze(api.import_torch(module, [x, residual]), AVX512,
                           api.BuildOptions(use_database=False))
    (func,) = [f for f in fused.functions.values() if isinstance(f, tirx.PrimFunc)]
    with AVX512.tvm_target() as target:
        assert cpu.RowReduction(VECTOR).apply(func, target, False) is None
        sch = cpu.DenseRowNorm(VECTOR).apply(func, target, False)
    assert sch is not None
    # the GEMM's tiles in one parallel loop (each thread reads only its column tiles' weights:
    # the weight, a constant, packed by a block the build moves out of the kernel), then the
    # norm's blocks in a second one over the 32 rows, each row's reductions in vectors
    assert len(_packing(sch)) == 1
    gemm = _extents(sch, "matmul_update")
    assert _kinds(sch, "matmul_update")[0] == "PARALLEL"
    assert _kinds(sch, "matmul_update")[-1] == "VECTORIZED"
    tile = gemm[-3] * gemm[-2] * gemm[-1]  # rows x blocks x lanes
    assert gemm[0] * tile >= 32 * 64
    norm = [b.name_hint for b in _blocks(sch) if b.name_hint.startswith(("T_layer_norm",
                                                                            "layer_norm"))]
    assert norm
    for name in norm:
        assert _kinds(sch, name)[0] == "PARALLEL" and _extents(sch, name)[0] == 32
    with torch.no_grad():
        expected = module(x, residual).numpy()
    params = [p.detach().numpy() for p in (module.linear.weight.T.contiguous(), module.linear.bias,
                                           module.norm.weight, module.norm.bias)]
    order = {"x": x.numpy(), "residual": residual.numpy()}
    arrays = [order.get(p.name, None) for p in func.params[:-1]]
    arrays = [a if a is not None else params.pop(0) for a in arrays]
    _close(_run(sch, arrays, expected.shape), expected)


def test_elementwise_inlines_and_vectorizes():
    def body(bb, x, y):
        return relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(relax.op.permute_dims(x, [1, 0])), y)))

    x = rng.standard_normal((256, 128)).astype("float32")
    y = rng.standard_normal((128, 256)).astype("float32")
    func = _kernel([("x", x.shape), ("y", y.shape)], body)
    sch = cpu.Elementwise(VECTOR).apply(func, None, False)
    (block,) = _blocks(sch)  # transpose and add inlined into the ReLU
    # the rows in parallel, each row's vectors inside (one fused loop divided its index per vector)
    assert _kinds(sch, block.name_hint) == ["PARALLEL", "SERIAL", "VECTORIZED"]
    assert _extents(sch, block.name_hint) == [128, 16, 16]
    _close(_run(sch, [x, y], (128, 256)), np.maximum(x.T + y, 0))
    assert cpu.Elementwise(VECTOR).apply(_kernel(*_dense(8, 32, 16, lambda t: t)), None,
                                         False) is None


@pytest.mark.parametrize("channels,width", [(512, 203), (48, 1001)])
def test_a_layout_transpose_is_tiled_in_both_axes(channels, width):
    """A conv's NHWC output as NCW for a GroupNorm and back (Wav2Vec2's feature encoder, at
    awkward widths): 16 x 16 tiles, the output's row of a tile one vector where it divides."""

    def to_nhwc(bb, x):  # [1, C, W] -> [1, 1, W, C]
        return relax.op.permute_dims(bb.emit(relax.op.reshape(x, [1, channels, 1, width])),
                                     [0, 2, 3, 1])

    def to_ncw(bb, y):  # [1, 1, W, C] -> [1, C, W]
        return relax.op.reshape(bb.emit(relax.op.permute_dims(y, [0, 3, 1, 2])),
                                [1, channels, width])

    x = rng.standard_normal((1, channels, width)).astype("float32")
    sch = cpu.Transpose(VECTOR).apply(_kernel([("x", x.shape)], to_nhwc), None, False)
    (block,) = _blocks(sch)
    kinds, extents = _kinds(sch, block.name_hint), _extents(sch, block.name_hint)
    assert extents[-2:] == [16, 16] and kinds[-1] == ("VECTORIZED" if channels % 16 == 0
                                                      else "SERIAL")
    assert "PARALLEL" in kinds
    np.testing.assert_array_equal(_run(sch, [x], (1, 1, width, channels)),
                                  x.transpose(0, 2, 1)[:, None])
    y = rng.standard_normal((1, 1, width, channels)).astype("float32")
    back = cpu.Transpose(VECTOR).apply(_kernel([("y", y.shape)], to_ncw), None, False)
    np.testing.assert_array_equal(_run(back, [y], (1, channels, width)), y[0].transpose(0, 2, 1))
    # an elementwise kernel, whose input and output have the same innermost axis, is not one
    assert cpu.Transpose(VECTOR).apply(_kernel(
        [("x", x.shape)], lambda bb, x: relax.op.nn.relu(x)), None, False) is None


@pytest.mark.parametrize("m,k,n", [(197, 64, 77), (1, 48, 1000), (49, 33, 50), (197, 40, 80),
                                   (5, 16, 4)])
def test_dense_keeps_full_vectors_and_its_tile_at_awkward_sizes(m, k, n):
    """Rows no tile divides get a predicated last row tile, columns no tile divides are padded
    to whole tiles (the padded weight packed with the rest): the hot loop stays zmm FMAs, never
    a smaller tile for the whole kernel or a scalar tail inside the vector loop."""
    inputs, body = _dense(m, k, n, relax.op.nn.relu)
    func = _kernel(inputs, body).with_attr("layout_free_buffers", [1])
    sch = cpu.Dense(VECTOR).apply(func, AVX512.tvm_target(), False)
    assert sch is not None
    rows, blocks, lanes = _extents(sch, "matmul_update")[-3:]
    assert lanes == 16
    # as many accumulators as the tile's width leaves room for (4x4, 3x5, 2x7), at most m rows
    assert rows == min(16 // blocks, m)
    assert len(_packing(sch)) == 1  # the weight, padded or not, packed at build time
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [x, w, b], (1, m, n)), np.maximum(x @ w + b, 0))
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}),
                      target=AVX512.tvm_target())
    fmas = [line for line in lib.mod.inspect_source("asm").splitlines() if "vfmadd" in line]
    assert fmas and all("ps" in line.split()[0] and "%zmm" in line for line in fmas), \
        "every FMA should be a packed zmm one: a scalar FMA is a tail inside the vector loop"


@pytest.mark.parametrize("m,n,tile", [(50, 64, (5, 2)), (197, 77, (6, 2)), (1, 1000, None)])
def test_dense_on_avx2_fits_sixteen_registers_and_uses_ymm_fmas(m, n, tile):
    """AVX2 has 16 vector registers of 8 lanes: the tile's accumulators, one vector of weights
    per column block and the broadcast fit in them, the FMAs are packed ymm ones (no zmm), and
    the numbers hold."""
    avx2 = api.get_target("avx2")
    inputs, body = _dense(m, 48, n, relax.op.nn.relu)
    func = _kernel(inputs, body).with_attr("layout_free_buffers", [1])
    sch = cpu.Dense(avx2.vector).apply(func, avx2.tvm_target(), False)
    rows, blocks, lanes = _extents(sch, "matmul_update")[-3:]
    assert lanes == 8 and rows * blocks + blocks + 1 <= 16
    # 12 accumulators, a GEMM's tile in 16 registers; 10 over 50 rows (54 in six-row tiles)
    assert tile is None or (rows, blocks) == tile
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}),
                      target=avx2.tvm_target())
    fmas = [line for line in lib.mod.inspect_source("asm").splitlines() if "vfmadd" in line]
    assert fmas and all("ps" in line.split()[0] and "%ymm" in line for line in fmas)
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [x, w, b], (1, m, n)), np.maximum(x @ w + b, 0))


@pytest.mark.parametrize("m", [50, 77, 198])
def test_dense_rows_are_padded_to_whole_tiles(m):
    """A predicated last row tile kept the accumulators of its maybe-empty rows in memory, in
    every tile (50x768x768: 136-166 GFLOP/s where 52 rows ran at 224): the activation's rows are
    zero-padded to whole tiles instead, and the reduction runs unpredicated."""
    inputs, body = _dense(m, 64, 64, relax.op.nn.relu)
    sch = cpu.Dense(VECTOR).apply(_kernel(inputs, body), AVX512.tvm_target(), False)
    update = sch.get_loops(sch.get_sblock("matmul_update"))[-1]
    predicate = sch.get(update).body.predicate
    assert isinstance(predicate, tirx.IntImm) and int(predicate) == 1
    assert "x_pad" in [b.name_hint for b in _blocks(sch)]
    x, w, b = (rng.standard_normal(s).astype("float32") for _, s in inputs)
    _close(_run(sch, [x, w, b], (1, m, 64)), np.maximum(x @ w + b, 0))


def test_dense_over_a_symbolic_length_keeps_its_tile_and_pads_the_rows():
    """``--dynamic seq``: rows are ``n``, unknown until the call; the tile is the full 4 x 4
    (not one row), the activation padded to ``(n + 3) // 4 * 4`` rows, and any ``n`` right."""
    n = tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, n, 64), "float32"))
    w = relax.Var("w", relax.TensorType((64, 64), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.matmul(x, w))))
        bb.emit_func_output(out)
    with AVX512.tvm_target():
        mod = relax.transform.LegalizeOps()(bb.get())
        mod = relax.transform.FuseTIR()(relax.transform.FuseOps()(
            relax.transform.AnnotateTIROpPattern()(mod)))
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    sch = cpu.Dense(VECTOR).apply(func, AVX512.tvm_target(), False)
    loops = sch.get_loops(sch.get_sblock("matmul_update"))
    assert [int(sch.get(loop).extent) for loop in loops[-3:]] == [4, 4, 16]
    assert "x_pad" in [b.name_hint for b in _blocks(sch)]
    update = sch.get_loops(sch.get_sblock("matmul_update"))[-1]
    predicate = sch.get(update).body.predicate
    assert isinstance(predicate, tirx.IntImm) and int(predicate) == 1
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}),
                      target=RUN.tvm_target())
    dev = tvm.cpu()
    weights = rng.standard_normal((64, 64)).astype("float32")
    for rows in (1, 5, 50):
        data = rng.standard_normal((1, rows, 64)).astype("float32")
        result = tvm.runtime.tensor(np.zeros((1, rows, 64), "float32"), dev)
        lib.mod["main"](tvm.runtime.tensor(data, dev), tvm.runtime.tensor(weights, dev), result)
        _close(result.numpy(), np.maximum(data @ weights, 0))


class _Rotary(torch.nn.Module):
    """Llama's rotary embedding over heads of ``dim``: ``q * cos + rotate_half(q) * sin``."""

    def __init__(self, dim: int, positions: int):
        super().__init__()
        angles = torch.arange(positions)[:, None] * 0.1 ** torch.arange(dim // 2)
        self.cos = torch.cat([angles, angles], -1).cos()
        self.sin = torch.cat([angles, angles], -1).sin()
        self.dim = dim

    def forward(self, x):
        q = x.view(1, x.shape[1], -1, self.dim).transpose(1, 2)
        half = torch.cat([-q[..., self.dim // 2:], q[..., :self.dim // 2]], -1)
        return (q * self.cos + half * self.sin).transpose(1, 2).reshape(x.shape)


@pytest.mark.parametrize("dim", [4, 8, 16])
def test_rotary_embedding_over_heads_narrower_than_a_vector(dim, tmp_path):
    """A head of 8 under 16 lanes: LLVM vectorized the kernel's scalar loop reading the angles
    as if ``j % 8`` were ``j`` (the next position's, and past the buffer on the last)."""
    model = api.import_torch(_Rotary(dim, 13).eval(), (torch.randn(1, 13, 32),))
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    deployed = api.load(api.build(compiled, tmp_path / "b"))
    assert set(deployed.manifest["implementations"].values()) == {"cpu.elementwise"}
    assert max(c.rel_err for c in verify(deployed, model)) < 1e-5


def test_a_vector_of_booleans_is_not_stored_packed(tmp_path):
    """Counting the tokens that are not padding (cpmant): TVM's LLVM code stored a vector of 8
    booleans as bits in a buffer of bytes, and 4 of 8 were counted as -12."""

    class Count(torch.nn.Module):
        def forward(self, ids, x):
            return x * torch.logical_not(ids == 0).long().sum(-1, keepdim=True)

    ids = torch.tensor([[0, 3, 0, 5, 6, 0, 7, 0]], dtype=torch.int32)
    model = api.import_torch(Count(), (ids, torch.randn(1, 8)))
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    deployed = api.load(api.build(compiled, tmp_path / "b"))
    assert "default" not in deployed.manifest["implementations"].values()
    out = deployed.run([ids.numpy(), np.ones((1, 8), "float32")])[0]
    np.testing.assert_array_equal(out, np.full((1, 8), 4.0, "float32"))
