"""The public API behind the CLI: import, compile, build into a folder, load, verify."""

from __future__ import annotations

import collections
import datetime
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from . import __version__, env, pipeline, profile, runtime, strategy
from . import bench as bench_
from .errors import TvmfuseError
from .frontend import ImportedModel, count_flops, import_model, import_torch
from .profile import Kernel
from .report import FusionGroup, Summary, fusion_groups, kernel_calls, summarize
from .rules import FUSION_RULES, load_rules
from .targets import TargetSpec, get_target
from .tuning import database as tuning_db

log = logging.getLogger(__name__)

__all__ = ["Analysis", "BuildOptions", "Compiled", "analyze", "benefit", "bench", "build",
           "compile_model", "default_database", "get_target", "import_model", "import_torch", "load",
           "profile_kernels", "tune"]


@dataclass(frozen=True)
class BuildOptions:
    """How to compile: the CLI fills this in, the pipeline reads it.

    ``database`` is a MetaSchedule JSON database folder; ``None`` takes the target's folder under
    ``tuning_logs/`` when it holds records, and ``use_database=False`` applies none at all.
    ``fusion_rules`` is a rules file over the shipped defaults (see :mod:`tvmfuse.rules`).
    ``dtype`` is the precision the kernels compute in: float32, or float16 (TVM's
    ToMixedPrecision after the folds; inputs and outputs stay float32). ``fusion=False`` turns
    tvmfuse's own fusion rules off (:data:`tvmfuse.rules.FUSION_RULES`) and keeps the rest: the
    "fusion alone" baseline, same layouts and schedules, TVM's FuseOps only.
    """

    database: Path | None = None
    use_database: bool = True
    dump_ir: Path | None = None
    fusion_rules: Path | None = None
    verify_fusion: bool = False
    dtype: str = "float32"
    fusion: bool = True


@dataclass
class Analysis:
    """What the pipeline made of a model up to FuseTIR: its kernels and fusion groups."""

    kernels: list[str]
    groups: list[FusionGroup]
    phase_seconds: dict[str, float]
    summary: Summary | None = None
    #: The tuning database the run applied (resolved only by runs that reach the schedules).
    database: Path | None = None
    #: Kernel -> the implementation it got (filled by runs that reach the schedule phase; see
    #: strategy.implementations): "tuned", "seed:cpu.conv2d", "cpu.conv2d", "default", ...
    implementations: dict[str, str] = field(default_factory=dict)
    #: Kernel -> its FLOPs per launch and parameter shapes (see tvmfuse.profile).
    kernel_info: dict[str, Kernel] = field(default_factory=dict)
    #: Kernels a pass wrote already scheduled (the fused attention): nothing for MetaSchedule to
    #: search, as ``tvmfuse tune`` also tells them, by their ``tirx.is_scheduled`` attribute.
    written_scheduled: set[str] = field(default_factory=set)

    @property
    def tuned(self) -> set[str]:
        """Kernels whose schedule came from the tuning database (searched or seeded)."""
        return {kernel for kernel, impl in self.implementations.items()
                if impl == strategy.TUNED or impl.startswith(f"{strategy.DATABASE_SEED}:")}

    @property
    def untuned(self) -> list[str]:
        """Kernel launches without a database record, in order (kernels written scheduled, such
        as the fused attention, have no search space and are not counted)."""
        tuned = self.tuned
        return [k for k in self.kernels if k not in tuned and k not in self.written_scheduled]


@dataclass
class Compiled:
    """A compiled model, not yet written anywhere."""

    model: ImportedModel
    target: TargetSpec
    executable: object  # tvm.relax.Executable
    analysis: Analysis
    seconds: float

    @property
    def database(self) -> Path | None:
        """The tuning database the build applied."""
        return self.analysis.database


def default_database(target: TargetSpec) -> Path | None:
    """The target's committed database under ``tuning_logs/``, if it holds records."""
    folder = env.TUNING_LOGS / target.key
    return folder if tuning_db.has_database(folder) else None


def tuning_database(target: TargetSpec, remote=None) -> Path:
    """Where ``tvmfuse tune`` writes by default: ``tuning_logs/<target-key>/``, or
    ``<target-key>-emulated/`` when it measures on an emulator (``remote.emulated``)."""
    suffix = "-emulated" if remote is not None and remote.emulated else ""
    return env.TUNING_LOGS / f"{target.key}{suffix}"


def analyze(model: ImportedModel, target: TargetSpec, options: BuildOptions, *,
            until: str | None = "fuse_tir"):
    """Run the pipeline on ``model`` up to ``until`` (None: all phases).

    Returns the transformed module and an :class:`Analysis`. Writes the IR after each phase when
    ``options.dump_ir`` is set.
    """
    import tvm  # noqa: PLC0415

    analysis = Analysis([], [], {})
    clock = [time.perf_counter()]

    def on_phase(name, mod):
        now = time.perf_counter()
        analysis.phase_seconds[name] = now - clock[0]
        clock[0] = now
        if name == "verify_fusion":  # the groups that survived the numeric gate, if it ran
            analysis.groups.extend(fusion_groups(mod))
        elif name == "fuse_tir":
            analysis.kernels.extend(kernel_calls(mod))
            analysis.summary = summarize(mod)
            analysis.kernel_info.update(profile.kernels(mod))
            analysis.written_scheduled.update(
                gvar.name_hint for gvar, func in mod.functions.items()
                if isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None
                and func.attrs.get("tirx.is_scheduled", False))
        elif name == "schedule":
            analysis.implementations.update(strategy.implementations(mod))
        elif name == "prepack":  # packed weights: the kernels' parameters changed shape
            for gvar, func in mod.functions.items():
                kernel = analysis.kernel_info.get(gvar.name_hint)
                if kernel is not None:
                    analysis.kernel_info[gvar.name_hint] = replace(
                        kernel, params=profile.param_specs(func))
        if options.dump_ir is not None:
            index = len(analysis.phase_seconds)
            (options.dump_ir / f"{index:02d}_{name}.py").write_text(mod.script(show_meta=False))

    if options.dump_ir is not None:
        options.dump_ir.mkdir(parents=True, exist_ok=True)
        (options.dump_ir / "00_import.py").write_text(model.mod.script(show_meta=False))
    rules = load_rules(target.rules_section, options.fusion_rules)
    if not options.fusion:
        rules = {name: replace(rule, enabled=False) if name in FUSION_RULES else rule
                 for name, rule in rules.items()}
    # The database matters only to a run that reaches the schedule phases; resolving it reads
    # and checks every record, so a run that stops before them skips it.
    reaches_schedules = until is None or until in ("apply_database", "schedule", "prepack", "lower")
    analysis.database = build_database(target, options) if reaches_schedules else None
    with tempfile.TemporaryDirectory(prefix="tvmfuse-db-") as scratch:
        # corrupt lines and other targets' records are left out of what the build applies
        applied = (None if analysis.database is None else
                   tuning_db.usable(analysis.database, target.config, Path(scratch)))
        pipeline_options = pipeline.PipelineOptions(rules, applied, options.verify_fusion,
                                                     options.dtype)
        mod = pipeline.run(model.mod, target, pipeline_options, until=until, on_phase=on_phase)
    return mod, analysis


def benefit(model: ImportedModel, target: TargetSpec, options: BuildOptions) -> dict:
    """Kernels and bytes moved for three pipelines side by side (every op its own kernel, TVM's
    stock FuseOps, tvmfuse) and tvmfuse's fusion groups: what ``tvmfuse inspect`` reports."""
    from . import report  # noqa: PLC0415

    tvm_target = target.tvm_target()
    _, analysis = analyze(model, target, options)
    return {
        "model": model.source,
        "target": target.name,
        "pipelines": {
            "unfused": report.summarize(report.unfused(model.mod, tvm_target)).to_json(),
            "stock": report.summarize(report.stock_fused(model.mod, tvm_target)).to_json(),
            "tvmfuse": analysis.summary.to_json(),
        },
        "groups": [g.to_json() for g in analysis.groups],
    }


def profile_kernels(model: ImportedModel, target: TargetSpec, options: BuildOptions) -> list[dict]:
    """Build ``model`` and time each of its kernels alone on this machine (see
    :mod:`tvmfuse.profile`): implementation, launches, ms per run and GFLOP/s, slowest first."""
    import tvm  # noqa: PLC0415

    reason = target.why_not_runnable()
    if reason is not None:
        raise TvmfuseError(f"cannot profile {target.name} here: {reason}")
    compiled = compile_model(model, target, options)
    device = tvm.cuda(0) if target.device == "cuda" else tvm.cpu(0)
    analysis = compiled.analysis
    times = profile.profile(compiled.executable, device, analysis.kernels,
                            analysis.implementations, analysis.kernel_info)
    return [t.to_json() for t in times]


def build_database(target: TargetSpec, options: BuildOptions) -> Path | None:
    """The tuning database a build with ``options`` applies, or None."""
    if not options.use_database:
        return None
    database = options.database or default_database(target)
    if database is not None and not tuning_db.has_database(database):
        raise TvmfuseError(
            f"{database} is not a tuning database: it needs {' and '.join(tuning_db.FILES)}"
        )
    return database


def compile_model(model: ImportedModel, target: TargetSpec, options: BuildOptions) -> Compiled:
    """Run the tvmfuse pipeline on ``model`` and build it for ``target``."""
    import tvm  # noqa: PLC0415

    log.info("compiling %s for %s (%s)", model.source, target.name, target.description)
    start = time.perf_counter()
    try:
        lowered, analysis = analyze(model, target, options, until=None)
        executable = tvm.compile(lowered, target=target.tvm_target(), relax_pipeline=None)
    except TvmfuseError:
        raise
    except Exception as err:  # noqa: BLE001 - TVM raises builtin types from C++; one line for users
        raise TvmfuseError(
            f"TVM failed to compile {model.source} for {target.name}: "
            f"{str(err).strip().splitlines()[-1]}"
        ) from err
    seconds = time.perf_counter() - start
    if options.dump_ir is not None:
        _dump_device_sources(executable, options.dump_ir)
    log.info("compiled to %d kernel launches (%d fusion groups) in %.1f s",
             len(analysis.kernels), len(analysis.groups), seconds)
    by_implementation = collections.Counter(analysis.implementations.get(k, strategy.DEFAULT)
                                            for k in analysis.kernels)
    log.info("implementations (kernel launches): %s",
             ", ".join(f"{name} {n}" for name, n in by_implementation.most_common()))
    if analysis.database is None:
        log.info("no tuning database: kernels run with the schedules above")
    else:
        untuned = analysis.untuned
        seeds = sum(analysis.implementations.get(k, "").startswith(strategy.DATABASE_SEED)
                    for k in analysis.kernels)
        log.info("tuning database %s: %d of %d kernel launches have a record (%d searched, %d "
                 "measured hand-written seeds); without one: %s", analysis.database,
                 len(analysis.kernels) - len(untuned), len(analysis.kernels),
                 len(analysis.kernels) - len(untuned) - seeds, seeds,
                 ", ".join(sorted(set(untuned))) or "none")
    return Compiled(model, target, executable, analysis, seconds)


def _dump_device_sources(executable, folder: Path) -> None:
    """Write the generated device code (CUDA C for GPU targets) beside the IR dumps."""
    pending = list(executable.mod.imports)
    while pending:
        module = pending.pop()
        pending.extend(module.imports)
        if module.kind == "cuda":
            (folder / "kernels.cu").write_text(module.inspect_source())


def build(compiled: Compiled, out_dir: str | Path) -> Path:
    """Write the deployable library and its ``manifest.json`` into ``out_dir``.

    The folder is written beside its final place and swapped in at the end, so a failed build
    leaves any earlier build there untouched.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the build from other users
    try:
        compiled.target.export(compiled.executable, str(staging / runtime.LIBRARY))
        manifest = _manifest(compiled)
        (staging / runtime.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        _write_check(compiled.model, staging / runtime.CHECK)
        _swap_in(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("wrote %s", out_dir)
    return out_dir


def _write_check(model: ImportedModel, path: Path) -> None:
    """Save the example inputs and the reference's outputs on them, for ``tvmfuse run --check``
    on a device that has no PyTorch."""
    if model.reference is None:
        return
    outputs = model.reference(*model.example_inputs)
    np.savez(path, **{f"input:{s.name}": a for s, a in zip(model.inputs, model.example_inputs)},
             **{f"output:{s.name}": a for s, a in zip(model.outputs, outputs)})


def _swap_in(staging: Path, out_dir: Path) -> None:
    if out_dir.exists() and not (out_dir / runtime.MANIFEST).is_file():
        raise TvmfuseError(f"{out_dir} exists and is not a tvmfuse build; choose another -o")
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        out_dir.rename(old)
    staging.rename(out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _manifest(compiled: Compiled) -> dict:
    import tvm  # noqa: PLC0415

    model, target = compiled.model, compiled.target
    return {
        "tvmfuse_version": __version__,
        "tvm_version": tvm.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": {"source": model.source, "kind": model.kind},
        "target": {"name": target.name, "key": target.key, "config": target.config,
                   "description": target.description},
        "library": runtime.LIBRARY,
        "inputs": [s.to_json() for s in model.inputs],
        "outputs": [s.to_json() for s in model.outputs],
        "kernels": len(compiled.analysis.kernels),
        "fusion_groups": [g.to_json() for g in compiled.analysis.groups],
        "database": _database_json(compiled.database),
        "untuned_kernels": sorted(set(compiled.analysis.untuned)) if compiled.database else None,
        # Kernel -> "tuned", the hand-written schedule rule ("cpu.conv2d"), or "default".
        "implementations": dict(sorted(compiled.analysis.implementations.items())),
        "compile_seconds": round(compiled.seconds, 2),
    }


def _database_json(database: Path | None) -> dict | None:
    if database is None:
        return None
    digest = hashlib.sha256()
    for name in tuning_db.FILES:
        digest.update((database / name).read_bytes())
    return {"path": str(database), "sha256": digest.hexdigest()}


def bench(model: ImportedModel, target: TargetSpec, engines: list[str], *, options: BuildOptions,
          threads: int, repeat: int, max_seconds: float, peak: bool,
          dtype: str = "float32") -> bench_.Report:
    """Time ``engines`` side by side on ``model``'s example inputs; see :mod:`tvmfuse.bench`.

    Every engine computes in ``dtype`` (float32, float16, bfloat16); its outputs are compared
    with the float32 reference (PyTorch eager, or ONNX Runtime for an ONNX file). Engines that
    cannot run here are skipped with the reason in the report.
    """
    import torch  # noqa: PLC0415

    from . import engines as engines_  # noqa: PLC0415
    from .verify import relative_error  # noqa: PLC0415

    # Read when TVM's pool starts: the CLI runs this before any kernel has run. Unpinned: this
    # process also hosts PyTorch's and ONNX Runtime's pools, and with TVM's workers bound to
    # cores the FMA peak measured 269-273 GFLOP/s (one core's worth) in 2 of 3 runs and ONNX
    # Runtime's ResNet-50 35 ms in one (19 ms otherwise); unpinned, 509-556 in 7 of 7 runs.
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
    if target.device == "cuda" and ctx.torch_module is not None:
        # Strict fp32 on both sides: cuDNN and cuBLAS would otherwise use TF32.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        ctx.torch_module = ctx.torch_module.to("cuda")
    report = bench_.Report(
        model=model.source, target=target.name, threads=threads,
        batch=next((d for d in model.inputs[0].shape[:1] if isinstance(d, int)), None),
        dtype=dtype, flops=flops,
        peak_gflops=bench_.measure_peak_gflops(target, threads) if peak else None,
    )
    prepared = {}
    for name in engines:
        log.info("preparing %s", name)
        try:
            prepared[name] = engines_.prepare(name, ctx)
        except engines_.Unavailable as why:
            log.warning("skipping %s: %s", name, why)
            report.skipped[name] = str(why)
    if not prepared:
        raise TvmfuseError("no engine could be prepared; see the warnings above")
    log.info("timing %s in interleaved rounds", ", ".join(prepared))
    if target.device == "cuda":
        report.timer, timer = "cuda-events", bench_.cuda_event_timer()
    else:
        timer = bench_.wall_clock_ms
    latencies = bench_.measure({n: e.run for n, e in prepared.items()}, repeat=repeat,
                               warmup=2, max_seconds=max_seconds, timer=timer)
    for latency in latencies:
        engine = prepared[latency.engine]
        errors = [relative_error(o, r) for o, r in zip(engine.outputs(), references)]
        report.results.append(bench_.Result(
            latency.engine, latency.median_ms, latency.min_ms, latency.max_ms,
            len(latency.times_ms), round(engine.setup_seconds, 2), max(errors, default=None),
            engine.kernels,
        ))
    report.finish()
    return report


def tune(model: ImportedModel, target: TargetSpec, options: BuildOptions, *, trials: int,
         trials_per_iter: int = 4, top_k: int | None = None, budget_s: float | None = None,
         retune: bool = False, only: list[str] | None = None, progress: bool = True,
         rpc: str | None = None):
    """Tune ``model``'s fused kernels (or ``only`` the named ones) for ``target`` into
    ``options.database`` (default: the target's folder under ``tuning_logs/``): hand-written
    seeds for every kernel, then a MetaSchedule search of ``trials`` over the ``top_k`` kernels
    that take the most time, within ``budget_s``; see :mod:`tvmfuse.tuning`. ``rpc``
    (``HOST:PORT:KEY``) measures on a device registered with an RPC tracker instead of here.
    Returns the database folder and the task plans."""
    from . import tuning  # noqa: PLC0415
    from .remote import Remote  # noqa: PLC0415

    remote = Remote.parse(rpc) if rpc is not None else None
    if remote is None and target.why_not_runnable() is not None:
        raise TvmfuseError(f"cannot tune for {target.name} here: {target.why_not_runnable()}; "
                           f"measure on a device with --rpc HOST:PORT:KEY")
    database = options.database or tuning_database(target, remote)
    if remote is not None and remote.emulated:
        if database.resolve() == (env.TUNING_LOGS / target.key).resolve():
            raise TvmfuseError(f"{remote.key} is an emulator: records measured there must not go "
                               f"into {target.name}'s database {database}; leave --db out (they "
                               f"go to {tuning_database(target, remote)})")
        log.warning("tuning on %s, an emulator: its times say nothing about %s's speed, and the "
                    "records go to %s, which builds never apply unless given with --db",
                    remote.key, target.name, database)
    mod, _ = analyze(model, target, BuildOptions(fusion_rules=options.fusion_rules,
                                                 use_database=False))
    with target.tvm_target():
        plans = tuning.tune(mod, target.tvm_target(), database, trials=trials,
                            scheduler=strategy.scheduler(target),
                            trials_per_iter=trials_per_iter, top_k=top_k, budget_s=budget_s,
                            retune=retune, only=only, progress=progress, remote=remote,
                            cross_cc=target.cross_cc)
    return database, plans


def load(path: str | Path, rpc: str | None = None) -> runtime.Deployed:
    """Load a build folder for running here, or on an RPC device (see :mod:`tvmfuse.runtime`)."""
    return runtime.load(path, rpc)
