"""One benchmark run: every engine prepared on the same model and inputs, timed side by side in
interleaved rounds (:mod:`.measure`), its outputs checked against the float32 reference, into one
:class:`~.report.Report`. Also the shorter comparison of ``tvmfuse build --bench``: the built
library against the model's reference."""

from __future__ import annotations

import copy
import logging
import os
import tempfile
from pathlib import Path

import torch

from ..errors import TvmfuseError, one_line
from ..frontend import ImportedModel, count_flops
from ..targets import TargetSpec
from ..verify import relative_error
from . import engines as engines_
from .measure import Latency, cuda_event_timer, measure, wall_clock_ms
from .peak import measure_peak_gflops
from .report import OWN, Report, Result

log = logging.getLogger(__name__)


def bench(model: ImportedModel, target: TargetSpec, engines: list[str], *, options,
          threads: int, repeat: int, max_seconds: float, peak: bool,
          dtype: str = "float32") -> Report:
    """Time ``engines`` side by side on ``model``'s example inputs (``options``: the
    :class:`tvmfuse.options.BuildOptions` of the TVM engines).

    Every engine computes in ``dtype`` (float32, float16, bfloat16); its outputs are compared
    with the float32 reference (PyTorch eager, or ONNX Runtime for an ONNX file), except the
    peers with a precision of their own (OpenVINO's default, int8). Engines that cannot run here,
    and peers that fail to prepare or to run, are skipped with the reason in the report
    (tvmfuse's own engines' failures stay errors).
    """
    # Read when TVM's pool starts: the CLI runs this before any kernel has run. Unpinned: this
    # process also hosts PyTorch's and ONNX Runtime's pools, and with TVM's workers bound to
    # cores the FMA peak often measured one core's worth and ONNX Runtime's ResNet-50 at times
    # ran at half speed; unpinned, every run reached both cores.
    os.environ["TVM_NUM_THREADS"] = str(threads)
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    torch.set_num_threads(threads)
    ctx = engines_.BenchContext(
        model=model, target=target, inputs=model.example_inputs, threads=threads,
        build_options=options, torch_module=model.torch_module,
        onnx_path=Path(model.source) if model.kind == "onnx" else None, dtype=dtype,
    )
    references = model.reference(*model.example_inputs)
    flops = count_flops(model)
    if target.is_gpu and ctx.torch_module is not None:
        # Strict fp32 on both sides: cuDNN and cuBLAS would otherwise use TF32.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        # on a copy: Module.to moves the model's own parameters, and its reference (CPU
        # inputs) could not run again afterwards
        ctx.torch_module = copy.deepcopy(ctx.torch_module).to("cuda")
    report = Report(
        model=model.source, target=target.name, threads=threads,
        batch=next((d for d in model.inputs[0].shape[:1] if isinstance(d, int)), None),
        dtype=dtype, flops=flops,
        peak_gflops=measure_peak_gflops(target, threads, dtype) if peak else None,
    )
    prepared, errors = {}, {}
    # the engines' files (ONNX exports, quantized models) are read while they are prepared
    with tempfile.TemporaryDirectory(prefix="tvmfuse-bench-") as scratch:
        ctx.scratch = Path(scratch)
        for name in engines:
            log.info("preparing %s", name)
            try:
                engine = engines_.prepare(name, ctx)
                # one run now: a peer that fails to run is skipped like one that cannot load
                errors[name] = max((relative_error(o, r) for o, r in
                                    zip(engine.outputs(), references)), default=None)
                prepared[name] = engine
            except engines_.Unavailable as why:
                _skip(report, name, str(why))
            except Exception as err:  # noqa: BLE001 - the peers' frameworks raise many types
                _skip_failed(report, name, err, "failed to prepare")
    if not prepared:
        raise TvmfuseError("no engine could be prepared; see the warnings above")
    if target.is_gpu:
        report.timer, timer = "cuda-events", cuda_event_timer()
    else:
        timer = wall_clock_ms
    while True:  # again without a peer that fails while it is timed
        log.info("timing %s in interleaved rounds", ", ".join(prepared))
        try:
            latencies = measure({n: _failing_as(n, e.run) for n, e in prepared.items()},
                                repeat=repeat, warmup=2, max_seconds=max_seconds, timer=timer)
            break
        except _EngineFailed as failed:
            _skip_failed(report, failed.engine, failed.__cause__, "failed to run")
            del prepared[failed.engine]
            if not prepared:
                raise TvmfuseError("every engine failed; see the warnings above") from None
    for latency in latencies:
        engine = prepared[latency.engine]
        report.results.append(Result(
            latency.engine, latency.median_ms, latency.min_ms, latency.max_ms,
            len(latency.times_ms), round(engine.setup_seconds, 2), errors[latency.engine],
            engine.kernels, precision=engine.precision or dtype, agreement=engine.agreement,
        ))
    report.finish()
    return report


def _skip(report: Report, engine: str, why: str) -> None:
    log.warning("skipping %s: %s", engine, why)
    report.skipped[engine] = why


class _EngineFailed(Exception):
    """Engine ``engine``'s run raised (the cause) while it was timed."""

    def __init__(self, engine: str):
        super().__init__(engine)
        self.engine = engine


def _failing_as(name: str, run):
    """``run``, raising :class:`_EngineFailed` for ``name`` from whatever it raises."""
    def guarded():
        try:
            return run()
        except Exception as err:
            raise _EngineFailed(name) from err

    return guarded


def _skip_failed(report: Report, name: str, err: BaseException, what: str) -> None:
    """A peer that ``what`` (failed to prepare, to run) is skipped with one warning line naming
    its error; tvmfuse's own engines raise it."""
    if name in OWN:
        raise err
    text = one_line(err)
    kind = type(err).__name__
    _skip(report, name, f"{what}: {text if text.startswith(kind) else f'{kind}: {text}'}")


def against_reference(deployed, model: ImportedModel, target: TargetSpec,
                      repeat: int) -> list[Latency]:
    """``tvmfuse build --bench``: the built library and the model's reference (PyTorch or ONNX
    Runtime) timed in interleaved rounds, tvmfuse first."""
    engines = {"tvmfuse": deployed.runner(model.example_inputs)}
    if model.reference is not None:
        if model.reference_name == "pytorch":
            torch.set_num_threads(target.config.get("num-cores", torch.get_num_threads()))
        engines[model.reference_name] = lambda: model.reference(*model.example_inputs)
    log.info("timing %s: %d interleaved rounds after a warm-up", ", ".join(engines), repeat)
    return measure(engines, repeat=repeat)
