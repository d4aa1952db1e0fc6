"""The engines `tvmfuse bench` compares, each prepared on the same model and inputs.

An engine is a blocking zero-argument callable for timing plus what it cost to prepare. A peer that
cannot be prepared here (no onnxruntime, an export that fails) raises :class:`Unavailable` and is
skipped with one log line.

Precision (``BenchContext.dtype``): every engine computes in it, and its outputs are compared
with the float32 PyTorch reference. PyTorch engines run the module and float inputs cast to it;
ONNX Runtime runs that module's export; the TVM engines run TVM's ``ToMixedPrecision`` over the
imported float32 module (convolutions and matmuls and what follows them in float16, inputs and
outputs in float32), which supports float16 only.
"""

from __future__ import annotations

import copy
import functools
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .bench import ENGINES
from .errors import TvmfuseError
from .frontend import ImportedModel
from .targets import TargetSpec

log = logging.getLogger(__name__)



class Unavailable(Exception):
    """This engine cannot run here; the message says why."""


@dataclass
class Engine:
    name: str
    run: Callable[[], object]  # one blocking inference on the bench inputs
    outputs: Callable[[], list[np.ndarray]]  # one inference, outputs as numpy (for the error)
    setup_seconds: float
    kernels: int | None = None


@dataclass
class BenchContext:
    model: ImportedModel
    target: TargetSpec
    inputs: list[np.ndarray]
    threads: int
    build_options: object  # api.BuildOptions
    torch_module: object | None  # the nn.Module for PyTorch engines, None for ONNX sources
    onnx_path: Path | None  # the ONNX file for ONNX sources
    dtype: str = "float32"  # the precision every engine computes in


def prepare(name: str, ctx: BenchContext) -> Engine:
    """Prepare engine ``name`` (one of ENGINES); raises Unavailable when it cannot run here."""
    start = time.perf_counter()
    engine = _PREPARE[name](ctx)
    engine.setup_seconds = time.perf_counter() - start
    return engine


# --- TVM ---------------------------------------------------------------------------------------


def _tvm_engine(name: str, executable, ctx: BenchContext, kernels: int | None) -> Engine:
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    from .runtime import to_numpy  # noqa: PLC0415

    device = tvm.cuda(0) if ctx.target.device == "cuda" else tvm.cpu(0)
    vm = relax.VirtualMachine(executable, device)
    args = [tvm.runtime.tensor(a, device) for a in ctx.inputs]
    main = vm["main"]

    def run():
        main(*args)
        device.sync()

    return Engine(name, run, lambda: to_numpy(main(*args)), 0.0, kernels)


def _tvmfuse(ctx: BenchContext, name: str = "tvmfuse", fusion: bool = True) -> Engine:
    """tvmfuse's build; ``fusion=False`` (the ``tvmfuse-unfused`` engine) turns its own fusion
    rules off and keeps the same layouts, schedules and database."""
    from . import api  # noqa: PLC0415

    _check_tvm_precision(ctx)
    options = replace(ctx.build_options, dtype=ctx.dtype, fusion=fusion)
    compiled = api.compile_model(ctx.model, ctx.target, options)
    return _tvm_engine(name, compiled.executable, ctx, len(compiled.analysis.kernels))


def _check_tvm_precision(ctx: BenchContext) -> None:
    from .pipeline import PRECISIONS  # noqa: PLC0415

    if ctx.dtype not in PRECISIONS:
        raise Unavailable(f"TVM's ToMixedPrecision converts to float16 only, not {ctx.dtype}")


def _stock_tvm(ctx: BenchContext) -> Engine:
    """TVM's own default build of the same Relax module (`tvm.compile` with the target's default
    pipeline), with the same tuning database applied after its FuseTIR when there is one."""
    import tvm  # noqa: PLC0415

    from . import api, pipeline  # noqa: PLC0415
    from .report import stock_kernel_calls  # noqa: PLC0415
    from .tuning import database as tuning_db  # noqa: PLC0415

    from tvm import relax  # noqa: PLC0415

    _check_tvm_precision(ctx)
    mod = ctx.model.mod
    if ctx.dtype != "float32":
        try:
            mod = relax.transform.ToMixedPrecision(out_dtype=ctx.dtype)(mod)
        except tvm.error.TVMError as err:  # e.g. a clip's scalar bounds (MobileNetV2's ReLU6)
            first_line = str(err).strip().splitlines()[-1]
            raise Unavailable(f"TVM's ToMixedPrecision fails on this model: {first_line}") from None
    target = ctx.target.tvm_target()
    database = api.build_database(ctx.target, ctx.build_options)
    with tempfile.TemporaryDirectory(prefix="tvmfuse-db-") as scratch:
        if database is not None:
            database = tuning_db.usable(database, ctx.target.config, Path(scratch))
        executable = tvm.compile(mod, target=target,
                                 relax_pipeline=pipeline.stock(target, database))
    return _tvm_engine("stock-tvm", executable, ctx, len(stock_kernel_calls(mod, target)))


# --- PyTorch -----------------------------------------------------------------------------------


def _torch_engine(name: str, fn, ctx: BenchContext) -> Engine:
    import torch  # noqa: PLC0415

    from .frontend import _flatten_torch  # noqa: PLC0415

    if ctx.torch_module is None:
        raise Unavailable(f"{ctx.model.source} is not a PyTorch model")
    cuda = ctx.target.device == "cuda"
    dtype = getattr(torch, ctx.dtype)
    args = tuple(torch.from_numpy(a).to("cuda" if cuda else "cpu",
                                        dtype if a.dtype.kind == "f" else None)
                 for a in ctx.inputs)

    def run():
        with torch.inference_mode():
            out = fn(*args)
        if cuda:
            torch.cuda.synchronize()
        return out

    def outputs():  # numpy has no bfloat16: compare in float32
        return [a.astype(np.float32) if a.dtype.kind == "f" else a
                for a in _flatten_torch(_map_floats(run(), lambda t: t.float()))]

    run()  # compiled engines compile on their first call: count it as setup
    return Engine(name, run, outputs, 0.0)


def _module(ctx: BenchContext):
    """The PyTorch module in the bench's precision (a copy: the reference stays float32)."""
    import torch  # noqa: PLC0415

    if ctx.torch_module is None:
        raise Unavailable(f"{ctx.model.source} is not a PyTorch model")
    return copy.deepcopy(ctx.torch_module).to(getattr(torch, ctx.dtype))


def _map_floats(tree, fn):
    import torch  # noqa: PLC0415
    from torch.utils import _pytree  # noqa: PLC0415

    return _pytree.tree_map(lambda t: fn(t) if isinstance(t, torch.Tensor)
                            and t.is_floating_point() else t, tree)


def _torch_eager(ctx: BenchContext) -> Engine:
    return _torch_engine("torch-eager", _module(ctx), ctx)


def _torch_compile(ctx: BenchContext) -> Engine:
    import torch  # noqa: PLC0415

    return _torch_engine("torch-compile", torch.compile(_module(ctx)), ctx)


def _torch_compile_freezing(ctx: BenchContext) -> Engine:
    import torch  # noqa: PLC0415

    # Freezing folds weights into the graph as constants: the fastest Inductor variant on CPU.
    compiled = torch.compile(_module(ctx), options={"freezing": True})
    return _torch_engine("torch-compile-freezing", compiled, ctx)


# --- ONNX Runtime ------------------------------------------------------------------------------


def _onnxruntime(ctx: BenchContext) -> Engine:
    try:
        import onnxruntime as ort  # noqa: PLC0415
    except ImportError:
        raise Unavailable("onnxruntime is not installed (pip install 'tvmfuse[onnx]')") from None
    providers = ["CPUExecutionProvider"]
    if ctx.target.device == "cuda":
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
        raise Unavailable(f"ONNX Runtime cannot load the model: {str(err).splitlines()[0][:200]}") \
            from None
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
    module = _module(ctx)
    path = Path(tempfile.mkdtemp(prefix="tvmfuse-bench-")) / "model.onnx"
    try:
        device = next(module.parameters()).device
        dtype = getattr(torch, ctx.dtype)
        args = tuple(torch.from_numpy(a).to(device, dtype if a.dtype.kind == "f" else None)
                     for a in ctx.inputs)
        torch.onnx.export(module, args,
                          str(path), dynamo=False, opset_version=17,
                          input_names=[s.name for s in ctx.model.inputs])
    except Exception as err:  # noqa: BLE001 - the exporter raises many types
        raise Unavailable(f"torch.onnx.export failed: {str(err).splitlines()[0][:200]}") from None
    return path


_PREPARE = {
    "tvmfuse": _tvmfuse,
    "tvmfuse-unfused": functools.partial(_tvmfuse, name="tvmfuse-unfused", fusion=False),
    "stock-tvm": _stock_tvm,
    "torch-eager": _torch_eager,
    "torch-compile": _torch_compile,
    "torch-compile-freezing": _torch_compile_freezing,
    "onnxruntime": _onnxruntime,
}


def check_names(names: list[str]) -> list[str]:
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise TvmfuseError(f"unknown engine {unknown[0]!r}; choose from: {', '.join(ENGINES)}")
    return names
