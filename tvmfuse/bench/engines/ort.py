"""ONNX Runtime: the ONNX file itself for ONNX sources, else the PyTorch module's export, with
every graph optimisation on and its workers not spinning between runs; and ``onnxruntime-int8``,
ONNX Runtime's static int8 quantization of the same float32 file on its CPU execution
provider."""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import numpy as np

from ...errors import one_line
from ...specs import AGREEMENT_SEEDS, CALIBRATION_SEEDS
from . import BenchContext, Engine, Unavailable, agreement, register
from .pytorch import module_in_precision


def _import_onnxruntime():
    try:
        import onnxruntime as ort  # noqa: PLC0415 - engines load their framework when prepared
    except ImportError:
        raise Unavailable("onnxruntime is not installed (pip install 'tvmfuse[onnx]')") from None
    return ort


def _session(ort, path: Path, ctx: BenchContext, providers: list[str]):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = ctx.threads
    options.inter_op_num_threads = 1
    # ORT's idle workers spin after each run; interleaved with other engines on the same cores
    # that spinning took the cores from the next engine (tvmfuse's ResNet-50 measured 61 ms
    # alone, 100 ms right after ORT runs).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(str(path), options, providers=providers)
    except Exception as err:  # noqa: BLE001 - e.g. an op without a kernel for this dtype
        raise Unavailable(f"ONNX Runtime cannot load the model: {one_line(err, 200)}") from None


def _engine(name: str, session, inputs: list[np.ndarray], dtype: str) -> Engine:
    feed = {i.name: a.astype(dtype) if a.dtype.kind == "f" else a
            for i, a in zip(session.get_inputs(), inputs)}

    def outputs():
        return list(session.run(None, feed))

    return Engine(name, outputs,
                  lambda: [o.astype(np.float32) if o.dtype.kind == "f" else o for o in outputs()],
                  0.0)


@register("onnxruntime")
def _onnxruntime(ctx: BenchContext) -> Engine:
    ort = _import_onnxruntime()
    providers = ["CPUExecutionProvider"]
    if ctx.target.is_gpu:
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise Unavailable("this onnxruntime has no CUDA execution provider")
        providers.insert(0, "CUDAExecutionProvider")
    dtype = ctx.peer_dtype
    if dtype == "bfloat16":
        raise Unavailable("ONNX Runtime's CPU kernels have no bfloat16")
    if dtype != "float32" and ctx.onnx_path is not None:
        raise Unavailable(f"{ctx.onnx_path} is an ONNX file in its own precision")
    session = _session(ort, onnx_model(ctx, dtype), ctx, providers)
    engine = _engine("onnxruntime", session, ctx.inputs, dtype)
    engine.precision = ctx.peer_precision
    return engine


@register("onnxruntime-int8")
def _onnxruntime_int8(ctx: BenchContext) -> Engine:
    """Static QDQ quantization (``quantize_static``) of the float32 file: per-channel int8
    weights, uint8 activations (the u8 x s8 products of AVX-512 VNNI's ``vpdpbusd``), min-max
    ranges calibrated on seeded inputs drawn as the bench's are, the op types ONNX Runtime
    quantizes by default."""
    ort = _import_onnxruntime()
    if ctx.target.is_gpu:
        raise Unavailable("ONNX Runtime's int8 kernels are its CPU execution provider's")
    from onnxruntime import quantization  # noqa: PLC0415

    source = onnx_model(ctx, "float32")
    folder = ctx.scratch_dir()
    prepared, quantized = folder / "int8-prepared.onnx", folder / "int8.onnx"
    names = [s.name for s in ctx.model.inputs]  # the export's input names

    class Calibration(quantization.CalibrationDataReader):
        def __init__(self):
            self.feeds = ({n: a for n, a in zip(names, ctx.seeded_inputs(seed))}
                          for seed in CALIBRATION_SEEDS)

        def get_next(self):
            return next(self.feeds, None)

    try:  # ORT's own advice before quantizing: shape inference and graph optimisation
        with contextlib.redirect_stdout(io.StringIO()), _quiet_logging():
            quantization.quant_pre_process(str(source), str(prepared))
            quantization.quantize_static(
                str(prepared), str(quantized), Calibration(),
                quant_format=quantization.QuantFormat.QDQ, per_channel=True,
                activation_type=quantization.QuantType.QUInt8,
                weight_type=quantization.QuantType.QInt8)
    except Exception as err:  # noqa: BLE001 - its pre-processing and quantizer raise many types
        raise Unavailable(f"ONNX Runtime's static quantization failed: {one_line(err, 200)}") \
            from None
    session = _session(ort, quantized, ctx, ["CPUExecutionProvider"])
    engine = _engine("onnxruntime-int8", session, ctx.inputs, "float32")
    engine.precision = "int8"
    engine.agreement = agreement(
        lambda arrays: session.run(None, dict(zip(names, arrays))), ctx, AGREEMENT_SEEDS)
    return engine


@contextlib.contextmanager
def _quiet_logging():
    """ONNX Runtime's quantizer logs through the root logger: a line per bias it copies and per
    weight it cannot quantize per channel (LayerNorm's rank-1 scales, kept per tensor), over 80
    lines on BERT-base, none of them a failure (a failure raises)."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def onnx_model(ctx: BenchContext, dtype: str) -> Path:
    """The ONNX file the ONNX Runtime and OpenVINO engines run: the source itself for ONNX
    sources, else the module's export in ``dtype``, made once per bench."""
    if ctx.onnx_path is not None:
        return ctx.onnx_path
    if dtype not in ctx.onnx_exports:
        try:
            ctx.onnx_exports[dtype] = export_onnx(ctx, dtype)
        except Unavailable as why:
            ctx.onnx_exports[dtype] = why
    found = ctx.onnx_exports[dtype]
    if isinstance(found, Unavailable):
        raise Unavailable(str(found))
    return found


def export_onnx(ctx: BenchContext, dtype: str | None = None) -> Path:
    """The PyTorch module's ONNX export in ``dtype`` (default: the bench's)."""
    import torch  # noqa: PLC0415

    dtype = dtype or ctx.peer_dtype
    module = module_in_precision(ctx, dtype)
    path = ctx.scratch_dir() / f"model-{dtype}.onnx"
    device = next(module.parameters()).device
    precision = getattr(torch, dtype)
    args = tuple(torch.from_numpy(a).to(device, precision if a.dtype.kind == "f" else None)
                 for a in ctx.inputs)
    names = [s.name for s in ctx.model.inputs]
    try:  # TorchScript's exporter first: what the zoo's published figures were measured with
        torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17,
                          input_names=names)
    except Exception as first:  # noqa: BLE001 - the exporter raises many types
        # it has no rule for some ops transformers uses (GPT-2's aten::diff); the torch.export
        # based exporter (onnxscript) covers more
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                torch.onnx.export(module, args, str(path), dynamo=True, input_names=names,
                                  optimize=True, verbose=False)
        except Exception as err:  # noqa: BLE001
            raise Unavailable(f"torch.onnx.export failed: {one_line(first, 200)}; with "
                              f"dynamo=True: {one_line(err, 200)}") from None
    return path
