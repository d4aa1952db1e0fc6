"""The PyTorch engines: eager, torch.compile, and torch.compile with freezing (weights folded
into the graph as constants: the fastest Inductor variant on CPU), each on a copy of the module
in the bench's precision."""

from __future__ import annotations

import copy

import numpy as np

from . import BenchContext, Engine, Unavailable, register


def _torch_engine(name: str, fn, ctx: BenchContext) -> Engine:
    import torch  # noqa: PLC0415 - engines load their framework when prepared

    from ...frontend import _flatten_torch, map_floats  # noqa: PLC0415

    if ctx.torch_module is None:
        raise Unavailable(f"{ctx.model.source} is not a PyTorch model")
    cuda = ctx.target.is_gpu
    dtype = getattr(torch, ctx.peer_dtype)
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
                for a in _flatten_torch(map_floats(run(), lambda t: t.float()))]

    run()  # compiled engines compile on their first call: count it as setup
    return Engine(name, run, outputs, 0.0, precision=ctx.peer_precision)


def module_in_precision(ctx: BenchContext, dtype: str | None = None):
    """The PyTorch module in ``dtype`` (default: the bench's precision), on a copy: the
    reference stays float32."""
    import torch  # noqa: PLC0415

    if ctx.torch_module is None:
        raise Unavailable(f"{ctx.model.source} is not a PyTorch model")
    return copy.deepcopy(ctx.torch_module).to(getattr(torch, dtype or ctx.peer_dtype))


@register("torch-eager")
def _torch_eager(ctx: BenchContext) -> Engine:
    return _torch_engine("torch-eager", module_in_precision(ctx), ctx)


@register("torch-compile")
def _torch_compile(ctx: BenchContext) -> Engine:
    import torch  # noqa: PLC0415

    return _torch_engine("torch-compile", torch.compile(module_in_precision(ctx)), ctx)


@register("torch-compile-freezing")
def _torch_compile_freezing(ctx: BenchContext) -> Engine:
    import torch  # noqa: PLC0415

    # Freezing folds weights into the graph as constants: the fastest Inductor variant on CPU.
    compiled = torch.compile(module_in_precision(ctx), options={"freezing": True})
    return _torch_engine("torch-compile-freezing", compiled, ctx)


@register("torch-compile-cudagraphs")
def _torch_compile_cudagraphs(ctx: BenchContext) -> Engine:
    """torch.compile with CUDA graphs (``mode="reduce-overhead"``): one graph replay per call,
    what PyTorch users deploy for latency on a GPU."""
    import torch  # noqa: PLC0415

    if not ctx.target.is_gpu:
        raise Unavailable("CUDA graphs need a CUDA target")
    compiled = torch.compile(module_in_precision(ctx), mode="reduce-overhead")
    engine = _torch_engine("torch-compile-cudagraphs", compiled, ctx)
    for _ in range(2):  # the graph is recorded on the calls after the first
        engine.run()
    return engine
