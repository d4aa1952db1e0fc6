"""Compiling: running the pipeline on an imported model under the build options
(:mod:`tvmfuse.options`), with what it learns of the model on the way (kernels, fusion groups,
implementations), and TVM's build of the result.

Writing the build folder is :mod:`tvmfuse.artifact`'s job; which tuning database applies is
:mod:`tvmfuse.tuning.lookup`'s.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import tvm

from . import buildtime, calibrate, kernel_cache, names, pipeline, profile, report, strategy
from .buildtime import BuildTimes
from .errors import CompileError, TvmfuseError, one_line
from .frontend import ImportedModel
from .options import BuildOptions
from .profile import Kernel
from .report import FusionGroup, Summary
from .targets import TargetSpec
from .tuning import database as tuning_db
from .tuning import lookup

log = logging.getLogger(__name__)


@dataclass
class Analysis:
    """What the pipeline made of a model up to FuseTIR: its kernels and fusion groups."""

    kernels: list[str]
    groups: list[FusionGroup]
    phase_seconds: dict[str, float]
    summary: Summary | None = None
    #: The tuning databases the run applied, the first one's records first (resolved only by
    #: runs that reach the schedules).
    databases: tuple[Path, ...] = ()
    #: Kernel -> the implementation it got (filled by runs that reach the schedule phase; see
    #: strategy.implementations): "tuned", "seed:cpu.conv2d", "cpu.conv2d", "default", ...
    implementations: dict[str, str] = field(default_factory=dict)
    #: Kernel -> its FLOPs per launch and parameter shapes (see tvmfuse.profile).
    kernel_info: dict[str, Kernel] = field(default_factory=dict)
    #: Kernels a pass wrote already scheduled (the fused attention): nothing for MetaSchedule to
    #: search, as ``tvmfuse tune`` also tells them, by their ``tirx.is_scheduled`` attribute.
    written_scheduled: set[str] = field(default_factory=set)

    @property
    def database(self) -> Path | None:
        """The first database the run applied (the user's, where there are two), or None."""
        return self.databases[0] if self.databases else None

    @property
    def tuned(self) -> set[str]:
        """Kernels whose schedule came from the tuning database (searched or seeded)."""
        return {kernel for kernel, impl in self.implementations.items()
                if impl.startswith((strategy.TUNED, f"{strategy.DATABASE_SEED}:"))}

    @property
    def untuned(self) -> list[str]:
        """Kernel launches without a database record, in order (kernels written scheduled, such
        as the fused attention, have no search space and are not counted)."""
        tuned = self.tuned
        return [k for k in self.kernels if k not in tuned and k not in self.written_scheduled]

    def observe(self, name: str, mod: tvm.IRModule) -> None:
        """Read what phase ``name`` tells of the model off its output ``mod``."""
        if name == "verify_fusion":  # the groups that survived the numeric gate, if it ran
            self.groups.extend(report.fusion_groups(mod))
        elif name == "fuse_tir":
            self.kernels.extend(report.kernel_calls(mod))
            self.summary = report.summarize(mod)
            self.kernel_info.update(profile.kernels(mod))
            self.written_scheduled.update(
                gvar.name_hint for gvar, func in mod.functions.items()
                if isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None
                and func.attrs.get(names.IS_SCHEDULED, False))
        elif name == "schedule":
            self.implementations.update(strategy.implementations(mod))
        elif name == "prepack":  # packed weights: the kernels' parameters changed shape
            for gvar, func in mod.functions.items():
                kernel = self.kernel_info.get(gvar.name_hint)
                if kernel is not None:
                    self.kernel_info[gvar.name_hint] = replace(
                        kernel, params=profile.param_specs(func))


@dataclass
class Compiled:
    """A compiled model, not yet written anywhere."""

    model: ImportedModel
    target: TargetSpec
    executable: object  # tvm.relax.Executable
    analysis: Analysis
    seconds: float
    #: What the kernels compute in (``BuildOptions.dtype``): float32, or float16 storage.
    precision: str = "float32"
    #: Seconds per stage of the build (export is added when the build folder is written).
    times: BuildTimes = field(default_factory=BuildTimes)
    #: What the build depends on, as :func:`tvmfuse.reuse.build_key` digests it (None: not
    #: computed); the manifest keeps it so that the same build again can keep this one.
    build_key: str | None = None
    #: The same known before the import (:func:`tvmfuse.reuse.source_key`; None where the
    #: model's source cannot be digested whole).
    source_key: str | None = None

    @property
    def database(self) -> Path | None:
        """The first tuning database the build applied (see :class:`Analysis`)."""
        return self.analysis.database


def analyze(model: ImportedModel, target: TargetSpec, options: BuildOptions, *,
            until: str | None = "fuse_tir"):
    """Run the pipeline on ``model`` up to ``until`` (None: all phases).

    Returns the transformed module and an :class:`Analysis`. Writes the IR after each phase when
    ``options.dump_ir`` is set, numbered as :data:`tvmfuse.pipeline.PHASES` numbers the phases.
    """
    analysis = Analysis([], [], {})
    options = calibrated(model, target, options)
    with _applied_database(target, options, analysis, pipeline.uses_database(until)) as database:
        mod = pipeline.run(model.mod, target, options, database=database, until=until,
                           on_phase=_observer(model, options, analysis))
    return mod, analysis


def calibrated(model: ImportedModel, target: TargetSpec, options: BuildOptions) -> BuildOptions:
    """``options`` with the ranges an int8 build quantizes with, measured by a calibration run
    (:mod:`tvmfuse.calibrate`) where they are not set yet; other builds' as they are."""
    if options.dtype != "int8" or options.int8_ranges is not None:
        return options
    ranges = calibrate.ranges(model, target, options,
                              lambda here, observing: pipeline.build(model.mod, here, observing))
    return replace(options, int8_ranges=ranges)


def _observer(model: ImportedModel, options: BuildOptions, analysis: Analysis,
              times: BuildTimes | None = None):
    """``on_phase`` for a pipeline run: times each phase, lets ``analysis`` read its output, and
    writes the IR dumps (the imported module's at once) when ``options.dump_ir`` is set. With
    ``times``, each phase's seconds go there too, and the reading and dumping as ``analysis``."""
    clock = [time.perf_counter()]

    def on_phase(name, mod):
        now = time.perf_counter()
        analysis.phase_seconds[name] = now - clock[0]
        if times is not None:
            times.add(name, now - clock[0])
        analysis.observe(name, mod)
        if options.dump_ir is not None:
            (options.dump_ir / pipeline.dump_name(name)).write_text(mod.script(show_meta=False))
        clock[0] = time.perf_counter()
        if times is not None:
            times.add("analysis", clock[0] - now)

    if options.dump_ir is not None:
        options.dump_ir.mkdir(parents=True, exist_ok=True)
        (options.dump_ir / pipeline.dump_name("import")).write_text(
            model.mod.script(show_meta=False))
    return on_phase


@contextlib.contextmanager
def _applied_database(target: TargetSpec, options: BuildOptions, analysis: Analysis,
                      needed: bool):
    """The database folder a run applies (None: none), recorded in ``analysis``; valid inside
    the ``with``. Resolving it reads and checks every record, so a run that stops before the
    schedule phases (not ``needed``) skips it."""
    if needed:
        analysis.databases = lookup.build_databases(target, options.database,
                                                    options.use_database)
    with tempfile.TemporaryDirectory(prefix="tvmfuse-db-") as scratch:
        # corrupt lines and other targets' records are left out of what the build applies
        yield tuning_db.usable(analysis.databases, target.config, Path(scratch))


def benefit(model: ImportedModel, target: TargetSpec, options: BuildOptions) -> dict:
    """Kernels and bytes moved for three pipelines side by side (every op its own kernel, TVM's
    stock FuseOps, tvmfuse) and tvmfuse's fusion groups: what ``tvmfuse inspect`` reports."""
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
    reason = target.why_not_runnable()
    if reason is not None:
        raise TvmfuseError(f"cannot profile {target.name} here: {reason}")
    compiled = compile_model(model, target, options)
    analysis = compiled.analysis
    times = profile.profile(compiled.executable, target.device_here(), analysis.kernels,
                            analysis.implementations, analysis.kernel_info)
    return [t.to_json() for t in times]


def compile_model(model: ImportedModel, target: TargetSpec, options: BuildOptions, *,
                  times: BuildTimes | None = None) -> Compiled:
    """Run the tvmfuse pipeline on ``model`` and build it for ``target``, adding the seconds
    of each stage to ``times`` (a fresh :class:`~tvmfuse.buildtime.BuildTimes` when None; the
    CLI passes the one its import was timed in)."""
    log.info("compiling %s for %s (%s)", model.source, target.name, target.description)
    if options.dtype == "int8" and target.vector is not None and not target.vector.dot_int8:
        log.warning("%s has no int8 dot product tvmfuse uses (AVX-512 VNNI's vpdpbusd): an int8 "
                    "build's GEMMs and convs sum in scalar integer arithmetic there; time it "
                    "against --dtype fp32 (tvmfuse bench) before deploying it", target.name)
    if options.dtype == "bfloat16" and target.vector is not None and not target.vector.dot_bf16:
        log.warning("%s has no bf16 dot product tvmfuse uses (AVX-512 BF16's vdpbf16ps): a "
                    "bf16 build stores bf16 but computes in float32 arithmetic, slower than "
                    "--dtype fp32 there", target.name)
    start = time.perf_counter()
    times = BuildTimes() if times is None else times
    analysis = Analysis([], [], {})
    kernel_cache.install(options.cache)
    try:
        if options.dtype == "int8":
            with times.measure("calibrate"):
                options = calibrated(model, target, options)
        with contextlib.ExitStack() as stack:
            with times.measure("database"):
                database = stack.enter_context(
                    _applied_database(target, options, analysis, True))
            executable = pipeline.build(
                model.mod, target, options, database=database,
                on_phase=_observer(model, options, analysis, times),
                lowering=lambda: buildtime.codegen_split(times, cuda_module=target.is_gpu))
    except CompileError as err:
        raise TvmfuseError(f"TVM failed to compile {model.source} for {target.name}: {err}") \
            from err
    except TvmfuseError:
        raise
    except Exception as err:  # noqa: BLE001 - TVM raises builtin types from C++; one line for users
        raise TvmfuseError(
            f"TVM failed to compile {model.source} for {target.name}: {one_line(err)}"
        ) from err
    seconds = time.perf_counter() - start
    if options.dump_ir is not None:
        _dump_device_sources(executable, options.dump_ir)
    log.info("compiled to %d kernel launches (%d fusion groups) in %.1f s",
             len(analysis.kernels), len(analysis.groups), seconds)
    _log_implementations(analysis)
    return Compiled(model, target, executable, analysis, seconds, options.dtype, times)


def _log_implementations(analysis: Analysis) -> None:
    by_implementation = collections.Counter(analysis.implementations.get(k, strategy.DEFAULT)
                                            for k in analysis.kernels)
    log.info("implementations (kernel launches): %s",
             ", ".join(f"{name} {n}" for name, n in by_implementation.most_common()))
    if not analysis.databases:
        log.info("no tuning database: kernels run with the schedules above")
        return
    untuned = analysis.untuned
    seeds = sum(analysis.implementations.get(k, "").startswith(strategy.DATABASE_SEED)
                for k in analysis.kernels)
    log.info("tuning database %s: %d of %d kernel launches have a record (%d searched, %d "
             "measured hand-written seeds); without one: %s",
             " over ".join(map(str, analysis.databases)),
             len(analysis.kernels) - len(untuned), len(analysis.kernels),
             len(analysis.kernels) - len(untuned) - seeds, seeds,
             ", ".join(sorted(set(untuned))) or "none")


def cuda_sources(executable) -> list[str]:
    """The CUDA C of each CUDA module of a build (none for a CPU build), the sm_90a one of the
    TIRx kernels (wgmma) included; each compiles on its own (they repeat their headers)."""
    pending, sources = list(executable.mod.imports), []
    while pending:
        module = pending.pop()
        pending.extend(module.imports)
        if module.kind == "cuda":
            sources.append(module.inspect_source())
    return sources


def cuda_source(executable) -> str | None:
    """The CUDA C of a build's kernels (None for a CPU build): every CUDA module's, joined."""
    sources = cuda_sources(executable)
    return "\n".join(sources) if sources else None


def _dump_device_sources(executable, folder: Path) -> None:
    """Write the generated device code (CUDA C for GPU targets) beside the IR dumps."""
    source = cuda_source(executable)
    if source is not None:
        (folder / "kernels.cu").write_text(source)
