"""The tvmfuse compilation pipeline: imported Relax in, a VM-ready module out.

One function lists the phases in order. Each phase is a named pass, so the build can dump the IR
after any of them (``--dump-ir``) and read the fusion groups after ``fuse_ops``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as cpu_backend
from tvm.relax.backend.cuda import pipeline as cuda_backend

from . import strategy
from .errors import TvmfuseError
from .passes import (
    DecomposeClip, FoldBatchNorm, FoldConstantCasts, FoldLayoutGlue, FoldMatmulReshape,
    FuseAttention, MarkGathersInjective, MarkWeightsLayoutFree, MergeParallelMatmul,
    MergeSummedConv, PrepackWeights, VerifyFusion,
)
from .patterns import fusion_patterns
from .rules import Rule
from .targets import TargetSpec
from .verify import TOLERANCE


@dataclass(frozen=True)
class PipelineOptions:
    """What the caller decides about a build; travels from the CLI to the passes."""

    #: The fusion rules for the target (see :mod:`tvmfuse.rules`).
    rules: dict[str, Rule]
    #: A MetaSchedule JSON database (folder) whose records replace the default schedules.
    database: Path | None = None
    #: Check every fused group against its ops one by one; split back the ones that fail.
    verify_fusion: bool = False
    #: The precision kernels compute in (see :data:`PRECISIONS`).
    dtype: str = "float32"

    def __post_init__(self):
        if self.dtype not in PRECISIONS:
            raise TvmfuseError(f"tvmfuse computes in {' or '.join(PRECISIONS)}, not {self.dtype} "
                               f"(TVM's ToMixedPrecision converts to float16 only)")


#: What a build can compute in: float16 is TVM's ToMixedPrecision (convs, matmuls and what
#: follows them in float16, inputs and outputs float32).
PRECISIONS = ("float32", "float16")


@dataclass(frozen=True)
class Phase:
    name: str
    transform: tvm.transform.Pass


def phases(target: TargetSpec, options: PipelineOptions) -> list[Phase]:
    """The pipeline's phases for ``target``, in the order they run."""
    tvm_target = target.tvm_target()
    rules = options.rules
    prepack = rules["prepack_weights"].enabled and target.vector is not None
    return [
        # 1. Fold: constants, BatchNorm into conv weights, reshapes around linear layers,
        #    parallel matmuls on one input into one GEMM, attention into one kernel; the
        #    precision (after the folds, whose patterns a cast would hide); then the strategy's
        #    layouts (NHWC convs on CPUs), weights transposed and converted here, at build time;
        #    in those layouts, summed 1x1 convs as one conv and layout no-ops folded away.
        Phase("fold", tvm.transform.Sequential([
            relax.transform.FoldConstant(),
            _if(rules["fold_batch_norm"].enabled, FoldBatchNorm()),
            _if(rules["fold_matmul_reshape"].enabled, FoldMatmulReshape()),
            _if(rules["horizontal_matmul"].enabled,
                MergeParallelMatmul(rules["horizontal_matmul"].max_group_size)),
            _attention(target, rules["fused_attention"].enabled),
            # ToMixedPrecision cannot type clip's scalar bounds (ReLU6): decomposed first; the
            # casts of constants it leaves (the bounds) are evaluated after it.
            _if(options.dtype == "float16", tvm.transform.Sequential([
                DecomposeClip(), relax.transform.ToMixedPrecision(out_dtype="float16"),
                FoldConstantCasts(),
            ])),
            *strategy.layout_passes(target, rules["conv_layout_nhwc"].enabled,
                                    rules["winograd_conv2d"].enabled),
            _if(rules["horizontal_conv"].enabled, MergeSummedConv()),
            _if(rules["fold_layout_glue"].enabled, FoldLayoutGlue()),
        ])),
        # 2. Canonicalize: what BatchNorm is left becomes arithmetic, and the `(out, mean, var)[0]`
        #    tuple it leaves is folded away so fusion can see through it.
        Phase("canonicalize", tvm.transform.Sequential([
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
        ])),
        # 3. tvmfuse's pattern rules group ops into kernels (conv/matmul epilogues, add+LayerNorm).
        Phase("fuse_patterns", relax.transform.FuseOpsByPattern(
            fusion_patterns(rules), bind_constants=False
        )),
        # 4. Legalize: every Relax op becomes a TIR PrimFunc; constant subgraphs are folded.
        Phase("legalize", tvm.transform.Sequential([
            relax.transform.LegalizeOps(strategy.legalize_overrides(
                target, rules["fast_erf"].enabled)),
            relax.transform.AnnotateTIROpPattern(),
            MarkGathersInjective(),  # embedding lookups and mask gathers join their neighbours
            relax.transform.FoldConstant(),
        ])),
        # 5. TVM's FuseOps groups what the patterns left (elementwise chains, reductions).
        Phase("fuse_ops", _if(rules["elementwise"].enabled, relax.transform.FuseOps())),
        # 6. The numeric gate (--verify-fusion): a group that fails to build or to match its
        #    ops run one by one is split back into them.
        Phase("verify_fusion", _if(options.verify_fusion, VerifyFusion(
            _group_builder(target, options), _device_here(target), TOLERANCE,
        ))),
        # 7. Each group becomes one PrimFunc; on CPUs the constants it reads (weights) are marked
        #    layout-free, for schedules (ours and MetaSchedule's) to choose their layout.
        Phase("fuse_tir", tvm.transform.Sequential([
            relax.transform.FuseTIR(),
            _if(prepack, MarkWeightsLayoutFree()),
        ])),
        # 8. Schedules: tuned records first, then the hand-written rules from schedules/, then
        #    TVM's defaults for what is left (see strategy.py); the weight layouts they chose are
        #    computed at build time.
        Phase("apply_database", tvm.transform.Sequential(_apply_database(options.database))),
        Phase("schedule", strategy.scheduler(target)),
        Phase("prepack", _if(prepack, PrepackWeights())),
        # 9. Lower dataflow to VM instructions and plan memory (TVM's per-target passes).
        Phase("lower", tvm.transform.Sequential(
            _backend(tvm_target).dataflow_lower_passes(tvm_target)
            + _backend(tvm_target).finalize_passes(tvm_target)
        )),
    ]


def _attention(target: TargetSpec, enabled: bool) -> tvm.transform.Pass:
    """Attention chains as one kernel each, where the target has the kernel."""
    kernel = strategy.attention_kernel(target)
    return FuseAttention(kernel) if enabled and kernel is not None else tvm.transform.Sequential([])


def _group_builder(target: TargetSpec, options: PipelineOptions):
    """Build a module holding one fused group the way the pipeline builds a model."""
    def build(mod: tvm.IRModule):
        for phase in phases(target, replace(options, verify_fusion=False)):
            if phase.name in ("fuse_tir", "apply_database", "schedule", "prepack", "lower"):
                mod = phase.transform(mod)
        return tvm.compile(mod, target=target.tvm_target(), relax_pipeline=None)

    return build


def _device_here(target: TargetSpec):
    if target.why_not_runnable() is not None:
        return None
    return tvm.cuda(0) if target.device == "cuda" else tvm.cpu(0)


def _if(condition: bool, transform: tvm.transform.Pass) -> tvm.transform.Pass:
    return transform if condition else tvm.transform.Sequential([])


def _backend(target: tvm.target.Target):
    # The backend modules themselves: 0.27's relax.pipeline dispatcher misses cpu_generic's.
    return cuda_backend if target.kind.name == "cuda" else cpu_backend


def stock(target: tvm.target.Target, database: Path | None) -> tvm.transform.Pass:
    """TVM's own default pipeline for ``target`` (what `tvm.compile` runs), with ``database``
    applied right after its FuseTIR when given: the "stock TVM" baseline of `tvmfuse bench`."""
    backend = _backend(target)

    @tvm.transform.module_pass(opt_level=0, name="StockTVM")
    def stock_pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:  # the database pass reads the current target
            passes = []
            for transform in (backend.library_dispatch_passes(target)
                              + backend.legalize_passes(target)):
                passes.append(transform)
                if transform.info.name == "FuseTIR":
                    passes += _apply_database(database)
            passes += backend.dataflow_lower_passes(target) + backend.finalize_passes(target)
            return tvm.transform.Sequential(passes)(mod)

    return stock_pipeline


def _apply_database(database: Path | None) -> list[tvm.transform.Pass]:
    if database is None:
        return []
    return [relax.transform.MetaScheduleApplyDatabase(str(database))]


def run(mod: tvm.IRModule, target: TargetSpec, options: PipelineOptions, *, until: str | None = None,
        on_phase=None) -> tvm.IRModule:
    """Run the phases on ``mod`` (up to and including ``until``), calling
    ``on_phase(name, mod)`` after each one."""
    # FuseOps' largest group is the elementwise rule's size limit.
    config = {"relax.FuseOps.max_depth": options.rules["elementwise"].max_group_size}
    with target.tvm_target(), tvm.transform.PassContext(opt_level=3, config=config):
        for phase in phases(target, options):
            mod = phase.transform(mod)
            if on_phase is not None:
                on_phase(phase.name, mod)
            if phase.name == until:
                break
    return mod
