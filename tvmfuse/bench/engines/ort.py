"""ONNX Runtime: the ONNX file itself for ONNX sources, else the PyTorch module's export, with
every graph optimisation on and its workers not spinning between runs."""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import numpy as np

from ...errors import one_line
from . import BenchContext, Engine, Unavailable, register
from .pytorch import module_in_precision


@register("onnxruntime")
def _onnxruntime(ctx: BenchContext) -> Engine:
    try:
        import onnxruntime as ort  # noqa: PLC0415
    except ImportError:
        raise Unavailable("onnxruntime is not installed (pip install 'tvmfuse[onnx]')") from None
    providers = ["CPUExecutionProvider"]
    if ctx.target.is_gpu:
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise Unavailable("this onnxruntime has no CUDA execution provider")
        providers.insert(0, "CUDAExecutionProvider")
    if ctx.dtype == "bfloat16":
        raise Unavailable("ONNX Runtime's CPU kernels have no bfloat16")
    if ctx.dtype != "float32" and ctx.onnx_path is not None:
        raise Unavailable(f"{ctx.onnx_path} is an ONNX file in its own precision")
    path = ctx.onnx_path or export_onnx(ctx)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = ctx.threads
    options.inter_op_num_threads = 1
    # ORT's idle workers spin after each run; interleaved with other engines on the same cores
    # that spinning took the cores from the next engine (tvmfuse's ResNet-50 measured 61 ms
    # alone, 100 ms right after ORT runs).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        session = ort.InferenceSession(str(path), options, providers=providers)
    except Exception as err:  # noqa: BLE001 - e.g. an op without a kernel for this dtype
        raise Unavailable(f"ONNX Runtime cannot load the model: {one_line(err, 200)}") from None
    feed = {i.name: a.astype(ctx.dtype) if a.dtype.kind == "f" else a
            for i, a in zip(session.get_inputs(), ctx.inputs)}

    def outputs():
        return list(session.run(None, feed))

    return Engine("onnxruntime", outputs,
                  lambda: [o.astype(np.float32) if o.dtype.kind == "f" else o for o in outputs()],
                  0.0)


def export_onnx(ctx: BenchContext) -> Path:
    import torch  # noqa: PLC0415

    if ctx.torch_module is None:
        raise Unavailable("no PyTorch module to export")
    module = module_in_precision(ctx)
    path = Path(tempfile.mkdtemp(prefix="tvmfuse-bench-")) / "model.onnx"
    device = next(module.parameters()).device
    dtype = getattr(torch, ctx.dtype)
    args = tuple(torch.from_numpy(a).to(device, dtype if a.dtype.kind == "f" else None)
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
