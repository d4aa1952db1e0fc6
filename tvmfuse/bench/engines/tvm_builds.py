"""The TVM engines: ``tvmfuse`` (the build), ``tvmfuse-unfused`` (its own fusion rules off, the
same layouts, schedules and database: what fusion alone is worth) and ``stock-tvm`` (TVM's
default pipeline on the same Relax module, with the same database)."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from . import BenchContext, Engine, Unavailable, agreement, register


def _tvm_engine(name: str, executable, ctx: BenchContext, kernels: int | None) -> Engine:
    """The build as a user deploys it: written as a shared library and loaded from it.

    Not the executable as the compiler left it in this process: the same kernels ran distilbert
    (suite) 1.5x and ViT 1.2x as fast loaded from the library as in-process; the kernels timed
    alone are as fast in both and the constants 64-byte aligned in both, so the loss is in how
    the in-process constants sit in memory (not pinned down further).
    """
    import tvm  # noqa: PLC0415 - engines load their framework when prepared (see the package)
    from tvm import relax  # noqa: PLC0415

    from ...cuda_fault import describe  # noqa: PLC0415
    from ...errors import TvmfuseError  # noqa: PLC0415
    from ...runtime import to_numpy  # noqa: PLC0415

    device = ctx.target.device_here()
    # kept while the engine lives (its runs refer to it): a CUDA error runs the library again
    # to name its kernel
    scratch = tempfile.TemporaryDirectory(prefix="tvmfuse-bench-")
    library = Path(scratch.name) / "model.so"
    ctx.target.export(executable, str(library))
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), device)
    args = [tvm.runtime.tensor(a, device) for a in ctx.inputs]
    main = vm["main"]

    def failing_as_one_line(fn):
        def guarded():
            try:
                return fn()
            except Exception as err:  # noqa: BLE001 - the VM raises TVM's errors of every kind
                line = describe(err, Path(scratch.name) / library.name, ctx.inputs)
                if line is None:
                    raise
                raise TvmfuseError(f"{name} failed on the GPU: {line}; this is a fault of "
                                   f"tvmfuse's kernel: please report it with the model") \
                    from err

        return guarded

    def run():
        main(*args)
        device.sync()

    engine = Engine(name, failing_as_one_line(run),
                    failing_as_one_line(lambda: to_numpy(main(*args))), 0.0, kernels)
    if ctx.dtype == "int8":  # on the inputs the int8 peer is judged on
        from ...specs import AGREEMENT_SEEDS  # noqa: PLC0415

        engine.agreement = agreement(
            lambda arrays: to_numpy(main(*(tvm.runtime.tensor(a, device) for a in arrays))),
            ctx, AGREEMENT_SEEDS)
    return engine


@register("tvmfuse-untuned", name="tvmfuse-untuned", untuned=True)
@register("tvmfuse-unfused", name="tvmfuse-unfused", fusion=False)
@register("tvmfuse")  # decorators run from the bottom: tvmfuse is registered first
def _tvmfuse(ctx: BenchContext, name: str = "tvmfuse", fusion: bool = True,
             untuned: bool = False) -> Engine:
    """tvmfuse's build; ``fusion=False`` (the ``tvmfuse-unfused`` engine) turns its own fusion
    rules off and keeps the same layouts, schedules and database; ``untuned`` (the
    ``tvmfuse-untuned`` engine) applies no tuning database (the rules' schedules), beside a
    ``tvmfuse`` engine that applies one."""
    from ... import compiler  # noqa: PLC0415

    _check_tvm_precision(ctx)
    options = replace(ctx.build_options, dtype=ctx.dtype, fusion=fusion)
    if untuned:
        options = replace(options, use_database=False, database=None)
    compiled = compiler.compile_model(ctx.model, ctx.target, options)
    return _tvm_engine(name, compiled.executable, ctx, len(compiled.analysis.kernels))


def _check_tvm_precision(ctx: BenchContext, stock: bool = False) -> None:
    """tvmfuse builds compute in every one of ``PRECISIONS``; stock TVM in float32 and float16
    (its ToMixedPrecision converts to float16 only: bfloat16 is tvmfuse's NarrowToBFloat16)."""
    from ...options import PRECISIONS  # noqa: PLC0415

    if stock and ctx.dtype not in ("float32", "float16"):
        raise Unavailable(f"TVM's ToMixedPrecision converts to float16 only, not {ctx.dtype}")
    if ctx.dtype not in PRECISIONS:
        raise Unavailable(f"tvmfuse builds compute in {', '.join(PRECISIONS)}, not {ctx.dtype}")


@register("stock-tvm")
def _stock_tvm(ctx: BenchContext) -> Engine:
    """TVM's own default build of the same Relax module (`tvm.compile` with the target's default
    pipeline), with the same tuning databases applied after its FuseTIR when there are any."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    from ... import pipeline  # noqa: PLC0415
    from ...errors import one_line  # noqa: PLC0415
    from ...report import stock_kernel_calls  # noqa: PLC0415
    from ...tuning import database as tuning_db  # noqa: PLC0415
    from ...tuning import lookup  # noqa: PLC0415

    _check_tvm_precision(ctx, stock=True)
    mod = ctx.model.mod
    if ctx.dtype != "float32":
        try:
            mod = relax.transform.ToMixedPrecision(out_dtype=ctx.dtype)(mod)
        except tvm.error.InternalError as err:  # e.g. a clip's scalar bounds (MobileNetV2's ReLU6)
            raise Unavailable(f"TVM's ToMixedPrecision fails on this model: {one_line(err)}") \
                from None
    target = ctx.target.tvm_target()
    options = ctx.build_options
    databases = lookup.build_databases(ctx.target, options.database, options.use_database)
    with tempfile.TemporaryDirectory(prefix="tvmfuse-db-") as scratch:
        database = tuning_db.usable(databases, ctx.target.config, Path(scratch))
        executable = tvm.compile(mod, target=target,
                                 relax_pipeline=pipeline.stock(target, database))
    return _tvm_engine("stock-tvm", executable, ctx, len(stock_kernel_calls(mod, target)))
