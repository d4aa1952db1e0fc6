"""OpenVINO on the CPU, from the same ONNX file ONNX Runtime runs (the float32 export of the
PyTorch module, or the ONNX source itself), with the latency hint and the bench's threads:
``openvino`` in the precision OpenVINO picks on this CPU (bf16 where it has AVX-512 BF16),
``openvino-fp32`` held to float32 (``INFERENCE_PRECISION_HINT`` f32)."""

from __future__ import annotations

import numpy as np

from ...errors import one_line
from . import BenchContext, Engine, Unavailable, register
from .ort import onnx_model

#: OpenVINO's element type names -> the bench's precision names.
_PRECISIONS = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


@register("openvino-fp32", name="openvino-fp32", fp32=True)
@register("openvino")  # decorators run from the bottom: openvino is registered first
def _openvino(ctx: BenchContext, name: str = "openvino", fp32: bool = False) -> Engine:
    try:
        import openvino as ov  # noqa: PLC0415 - engines load their framework when prepared
        from openvino import properties  # noqa: PLC0415
        from openvino.properties import hint  # noqa: PLC0415
    except ImportError:
        raise Unavailable("openvino is not installed (pip install 'tvmfuse[openvino]')") \
            from None
    if ctx.target.is_gpu:
        raise Unavailable("OpenVINO runs on the CPU here (its GPU plugin is for Intel GPUs)")
    path = onnx_model(ctx, "float32")
    inputs = [a.astype(np.float32) if a.dtype.kind == "f" else a for a in ctx.inputs]
    config = {hint.performance_mode: hint.PerformanceMode.LATENCY,
              properties.inference_num_threads: ctx.threads}
    if fp32:
        config[hint.inference_precision] = ov.Type.f32
    try:
        core = ov.Core()
        model = core.read_model(str(path))
        # the bench's shapes, static: an ONNX source may leave its batch or sequence open
        model.reshape({i: ov.PartialShape(a.shape) for i, a in enumerate(inputs)})
        compiled = core.compile_model(model, "CPU", config)
    except Exception as err:  # noqa: BLE001 - OpenVINO raises RuntimeError for most failures
        raise Unavailable(f"OpenVINO cannot compile the model: {one_line(err, 200)}") from None
    request = compiled.create_infer_request()
    for i, array in enumerate(inputs):
        request.set_input_tensor(i, ov.Tensor(np.ascontiguousarray(array)))
    count = len(compiled.outputs)

    def outputs():
        request.infer()
        return [np.array(request.get_output_tensor(i).data, copy=True) for i in range(count)]

    picked = compiled.get_property(hint.inference_precision).get_type_name()
    return Engine(name, request.infer, outputs, 0.0,
                  precision=_PRECISIONS.get(picked, picked))
