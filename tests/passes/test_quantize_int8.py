"""QuantizeInt8 and its calibration (tvmfuse/passes/quantize_int8.py, tvmfuse/calibrate.py): the
GEMMs and convs over constant weights read uint8 and int8 and sum in int32, a signed padded
input is padded with its zero point, a residual block's input is stored only quantized, and the
build stays within int8's error of PyTorch float32 with the same top-1."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import numpy as np
import pytest
import torch
from tvm import relax

from tvmfuse import api, calibrate, compiler, pipeline
from tvmfuse.errors import TvmfuseError
from tvmfuse.passes import QuantizeInt8
from tvmfuse.passes.quantize_int8 import activation_scale, weight_scales
from tvmfuse.specs import CALIBRATION_SEEDS
from tvmfuse.verify import relative_error

from conftest import HOST, run_cli

TARGET = api.get_target(HOST)
INT8 = api.BuildOptions(dtype="int8", use_database=False)


class Block(torch.nn.Module):
    """An RGB stem (3 channels, padded, over a signed input), a bottleneck whose input the
    residual add reads too, a max pool, a classifier: at sizes no tile divides."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem = torch.nn.Conv2d(3, 24, 5, padding=2)
        self.reduce = torch.nn.Conv2d(24, 20, 1)
        self.middle = torch.nn.Conv2d(20, 20, 3, padding=1)
        self.expand = torch.nn.Conv2d(20, 24, 1)
        self.head = torch.nn.Linear(24, 13)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.stem(x)), 3, 2, 1)
        z = torch.relu(self.middle(torch.relu(self.reduce(y))))
        y = torch.relu(self.expand(z) + y)
        return self.head(y.mean((2, 3)))


@pytest.fixture(scope="module")
def block():
    return api.import_torch(Block(), [torch.randn(1, 3, 19, 19)], name="block")


def _calls(mod, op: str) -> list[relax.Call]:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(
        e, relax.Call) and getattr(e.op, "name", None) == op else None)
    return found


def test_every_conv_and_matmul_over_constant_weights_sums_uint8_by_int8_in_int32(block):
    options = compiler.calibrated(block, TARGET, INT8)
    assert len(options.int8_ranges) == 5  # stem, pool, block middle, block output, head input
    mod = pipeline.run(block.mod, TARGET, options, until="fold")
    convs, matmuls = _calls(mod, "relax.nn.conv2d"), _calls(mod, "relax.matmul")
    assert len(convs) == 4 and len(matmuls) == 1
    for call in convs + matmuls:
        assert [str(a.ty.dtype) for a in call.args] == ["uint8", "int8"], call
        assert str(call.attrs.out_dtype) == "int32"
    # the stem's signed input padded with its zero point and to 4 channels by a pad of its own
    (pad,) = _calls(mod, "relax.nn.pad")
    low, high, _ = options.int8_ranges[0]
    assert low < 0 and pad.attrs.pad_value == activation_scale(low, high)[1]
    assert [int(d) for d in pad.ty.shape] == [1, 23, 23, 4]
    # the stem (its 4-channel weight) pads nothing itself; the block's 3x3 conv keeps its
    # padding (its input is a ReLU's: zero point 0)
    paddings = {int(c.args[1].ty.shape[2]): [int(p) for p in c.attrs.padding] for c in convs}
    assert paddings[4] == [0, 0, 0, 0] and paddings[20] in ([1, 1, 1, 1], [0, 0, 0, 0])
    # the max pool runs on the quantized stem output; no float32 pool is left
    (pool,) = _calls(mod, "relax.nn.max_pool2d")
    assert str(pool.ty.dtype) == "uint8"


def test_the_build_fuses_the_quantization_and_matches_pytorch_within_int8_error(block, tmp_path):
    compiled = api.compile_model(block, TARGET, INT8)
    kernels = compiled.analysis.implementations
    assert list(kernels.values()).count("cpu.conv2d") == 4
    # the block's convs write its next input quantized: uint8 out of the conv's own kernel
    assert sum("clip_relax_astype" in name for name in kernels) >= 2
    deployed = api.load(api.build(compiled, tmp_path / "out"))
    assert deployed.precision == "int8"
    for seed in range(5):
        x = np.random.default_rng(seed).standard_normal((1, 3, 19, 19)).astype("float32")
        out, ref = deployed.run([x])[0], block.reference(x)[0]
        assert relative_error(out, ref) < 3e-2
        assert out.argmax() == ref.argmax()


def test_a_transformer_in_int8_keeps_its_cosine_with_pytorch(tmp_path):
    model = api.import_model("tiny-transformer")
    compiled = api.compile_model(model, TARGET, INT8)
    mod, _ = api.analyze(model, TARGET, INT8, until="fold")
    assert all(str(c.args[0].ty.dtype) == "uint8" for c in _calls(mod, "relax.matmul")
               if str(c.args[1].ty.dtype) == "int8")
    assert len([c for c in _calls(mod, "relax.matmul") if str(c.args[1].ty.dtype) == "int8"]) >= 4
    out = api.load(api.build(compiled, tmp_path / "out")).run(model.example_inputs)[0]
    ref = model.reference(*model.example_inputs)[0]
    cosine = float(out.ravel() @ ref.ravel() / np.linalg.norm(out) / np.linalg.norm(ref))
    assert cosine > 0.999 and relative_error(out, ref) < 5e-2


def test_a_site_whose_input_a_uint8_grid_resolves_poorly_stays_float32(block, caplog,
                                                                       tmp_path):
    options = compiler.calibrated(block, TARGET, INT8)
    ranges = list(options.int8_ranges)
    low, high, _ = ranges[2]  # the block's 3x3 conv's input
    ranges[2] = (low, high, (high - low) / 1000)  # a spread far inside the range: outliers
    options = replace(options, int8_ranges=tuple(ranges))
    caplog.set_level(logging.WARNING)
    mod = pipeline.run(block.mod, TARGET, options, until="fold")
    assert "(conv2d input" in caplog.text and "stays float32" in caplog.text
    inputs = sorted(str(c.args[0].ty.dtype) for c in _calls(mod, "relax.nn.conv2d"))
    assert inputs == ["float32", "uint8", "uint8", "uint8"]
    deployed = api.load(api.build(api.compile_model(block, TARGET, options), tmp_path / "out"))
    x = block.example_inputs[0]
    assert relative_error(deployed.run([x])[0], block.reference(x)[0]) < 3e-2


def test_ranges_for_another_module_are_refused(block):
    options = compiler.calibrated(block, TARGET, INT8)
    mod = pipeline.run(block.mod, TARGET, api.BuildOptions(use_database=False), until="fold")
    # (raised through TVM's pass machinery, which passes the message on)
    with pytest.raises(Exception, match="calibration observed 4 quantized inputs where the "
                                        "module has 5"):
        QuantizeInt8(options.int8_ranges[:4])(mod)


def test_scales_hold_zero_exactly_and_weights_use_the_symmetric_range():
    scale, zero = activation_scale(-1.0, 3.0)
    assert zero == 64 and scale == pytest.approx(4 / 255)
    assert activation_scale(0.5, 2.0) == (pytest.approx(2 / 255), 0)  # 0 joins the range
    assert activation_scale(0.0, 0.0)[0] == 1.0  # a constant-zero input
    with pytest.raises(TvmfuseError, match="non-finite"):
        activation_scale(float("-inf"), 1.0)
    weight = np.array([[1.0, 0.0, -2.0], [-0.5, 0.0, 1.0]], "float32")
    quantized, scale = weight_scales(weight)
    assert quantized.dtype == np.int8 and quantized[:, 0].tolist() == [127, -64]
    assert quantized[:, 1].tolist() == [0, 0] and scale[1] == 1.0  # an all-zero column
    assert np.abs(quantized).max() == 127


def test_calibration_inputs_from_a_file_and_its_errors(block, tmp_path):
    x = np.random.default_rng(1).standard_normal((3, 1, 3, 19, 19)).astype("float32")
    np.savez(tmp_path / "good.npz", x=x)
    sets = calibrate.input_sets(block, tmp_path / "good.npz")
    assert len(sets) == 3 and sets[2][0].shape == (1, 3, 19, 19)
    assert len(calibrate.input_sets(block, None)) == len(CALIBRATION_SEEDS)
    np.savez(tmp_path / "named.npz", image=x)
    with pytest.raises(TvmfuseError, match="has no array 'x'"):
        calibrate.input_sets(block, tmp_path / "named.npz")
    np.savez(tmp_path / "flat.npz", x=x[0])
    with pytest.raises(TvmfuseError, match="sets of shape"):
        calibrate.input_sets(block, tmp_path / "flat.npz")
    (tmp_path / "bad.npz").write_text("not numpy")
    with pytest.raises(TvmfuseError, match="cannot read calibration inputs"):
        calibrate.input_sets(block, tmp_path / "bad.npz")


def test_cli_builds_and_verifies_int8_and_names_a_bad_calibration_file(tmp_path):
    done = run_cli("build", "tiny-resnet", "--dtype", "int8", "--verify", "-o",
                   str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "int8 calibration" in done.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["precision"] == "int8"
    # top-1 agreement with PyTorch over 100 seeded inputs, in the manifest
    agreed = manifest["verification"]["agreement"]
    assert agreed["inputs"] == 100 and agreed["top1"] >= 0.99
    done = run_cli("build", "tiny-resnet", "--dtype", "int8", "--target", "cuda-sm90", "-o",
                   str(tmp_path / "gpu"))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "--dtype int8 builds for CPUs" in done.stderr
    (tmp_path / "bad.npz").write_text("not numpy")
    done = run_cli("build", "tiny-resnet", "--dtype", "int8", "--calibrate",
                   str(tmp_path / "bad.npz"), "-o", str(tmp_path / "out2"))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "cannot read calibration inputs" in done.stderr
