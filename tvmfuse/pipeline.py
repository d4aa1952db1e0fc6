"""The tvmfuse compilation pipeline: imported Relax and the build options in, a VM-ready module
(:func:`run`) or its executable (:func:`build`) out.

One function lists the phases in order. Each phase is a named pass, so the build can dump the IR
after any of them (``--dump-ir``) and read the fusion groups after ``fuse_ops``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import tvm
from tvm import relax

from . import strategy
from .errors import CompileError, TvmfuseError, one_line
from .options import BuildOptions
from .passes import (
    ApplyDatabase,
    CompareBooleansAsIntegers,
    Conv1DAsConv2D,
    DecomposeClip,
    DropUnusedShapeCasts,
    EinsumAsMatmul,
    ExpandIntegerPower,
    FoldBatchNorm,
    FoldConstantCasts,
    FoldConstantsInNumPy,
    FoldCreationOps,
    FoldGeluTanh,
    FoldLayoutGlue,
    FoldMatmulReshape,
    FoldPadIntoConv,
    FoldRemainingConstants,
    FuseAttention,
    GlobalPoolToReduce,
    GroupNormAsLayerNorm,
    MarkGathersInjective,
    MarkWeightsLayoutFree,
    MergeParallelMatmul,
    MergeSummedConv,
    NarrowToBFloat16,
    ObserveQuantized,
    PointConvAsMatmul,
    PrepackWeights,
    QuantizeInt8,
    SelectInFloat32,
    SliceScatterAsConcat,
    StoreNarrowed,
    TransposedConvAsConv,
    VerifyFusion,
    WidenElementwise,
    WidenEpilogues,
)
from .patterns import fusion_patterns
from .rules import FUSION_RULES, Rule, load_rules
from .strategy import accumulate
from .targets import TargetSpec, relax_backend
from .verify import TOLERANCE


@dataclass(frozen=True)
class _Plan:
    """What one pipeline run derives from its target and options, once, for every phase."""

    target: TargetSpec
    options: BuildOptions
    #: The target's fusion rules: the shipped ones under ``options.fusion_rules``, tvmfuse's own
    #: fusion off where ``options.fusion`` is False (see :mod:`tvmfuse.rules`).
    rules: dict[str, Rule]
    #: The MetaSchedule JSON database (folder) whose records replace the default schedules.
    database: Path | None
    #: The strategy of the target's family (see :mod:`tvmfuse.strategy`).
    family: strategy.Strategy
    tvm_target: tvm.target.Target


def _plan(target: TargetSpec, options: BuildOptions, database: Path | None) -> _Plan:
    """The rules, strategy and TVM target a run of the pipeline for ``target`` reads."""
    rules = load_rules(target.rules_section, options.fusion_rules)
    if options.dtype == "int8":  # Winograd's convs are float32 batched matmuls, unquantized
        rules = {**rules, "winograd_conv2d": replace(rules["winograd_conv2d"], enabled=False)}
    if not options.fusion:
        rules = {name: replace(rule, enabled=False) if name in FUSION_RULES else rule
                 for name, rule in rules.items()}
    return _Plan(target, options, rules, database, strategy.for_target(target),
                  target.tvm_target())


#: The phases in the order they run, each with its number: IR dumps are ``NN_<phase>.py``
#: (``00_import.py`` is the imported module), and the comments in :func:`_phases` number them so.
PHASES = ("fold", "canonicalize", "fuse_patterns", "legalize", "fuse_ops", "verify_fusion",
          "fuse_tir", "apply_database", "schedule", "prepack", "lower")
#: The first phase that works on kernels (PrimFuncs) rather than on the graph: from here on the
#: phases are what building one fused group needs (VerifyFusion).
FIRST_KERNEL_PHASE = "fuse_tir"
#: The first phase that reads the tuning database.
FIRST_DATABASE_PHASE = "apply_database"


@dataclass(frozen=True)
class Phase:
    name: str
    transform: tvm.transform.Pass

    @property
    def number(self) -> int:
        return PHASES.index(self.name) + 1

    @property
    def on_kernels(self) -> bool:
        """Whether it works on the kernels (after FuseTIR) rather than on the graph."""
        return self.number >= PHASES.index(FIRST_KERNEL_PHASE) + 1


def dump_name(phase: str) -> str:
    """The IR dump file of ``phase`` (``"import"`` for the imported module)."""
    number = 0 if phase == "import" else PHASES.index(phase) + 1
    return f"{number:02d}_{phase}.py"


def uses_database(until: str | None) -> bool:
    """Whether a run that stops after phase ``until`` (None: the whole pipeline) reads the
    tuning database."""
    return until is None or PHASES.index(until) >= PHASES.index(FIRST_DATABASE_PHASE)


def _phases(plan: _Plan) -> list[Phase]:
    """The pipeline's phases for ``plan``'s target, in the order they run."""
    options, rules, family, tvm_target = plan.options, plan.rules, plan.family, plan.tvm_target
    prepack = family.prepacks_weights(rules)
    backend = plan.target.relax_backend()
    listed = [
        # 1. Fold: constants, BatchNorm into conv weights, reshapes around linear layers,
        #    parallel matmuls on one input into one GEMM, attention into one kernel; the
        #    precision (after the folds, whose patterns a cast would hide); then the strategy's
        #    layouts (NHWC convs on CPUs), weights transposed and converted here, at build time;
        #    in those layouts, summed 1x1 convs as one conv and layout no-ops folded away.
        Phase("fold", tvm.transform.Sequential([
            DropUnusedShapeCasts(),  # a `.item()` nothing reads (ToMixedPrecision stops on it)
            FoldCreationOps(),  # aranges and fills: what is computed from them folds in float32
            EinsumAsMatmul(),  # ONNX's Einsum (CvT's attention): matmuls the GEMM rules take
            CompareBooleansAsIntegers(),  # LLVM code compares booleans as neither ints nor floats
            TransposedConvAsConv(),  # decoders' upsampling: convs over a zero-dilated input
            FoldConstantsInNumPy(),  # what NumPy computes, without compiling a kernel for it
            FoldRemainingConstants(),  # and what TVM's FoldConstant computes
            GlobalPoolToReduce(),  # a pool whose window is the whole input: a mean
            FoldPadIntoConv(),  # "same" padding as its own pad op: the conv's padding
            Conv1DAsConv2D(),  # 1-D convs (an audio stem) through the 2-D conv path
            GroupNormAsLayerNorm(),  # and the GroupNorm after one as the row LayerNorm it is
            FoldGeluTanh(),  # GPT-2's GELU, written out: one gelu_tanh
            ExpandIntegerPower(),  # RMSNorm's x ** 2 as x * x (CUDA's fast powf: NaN for x < 0)
            _if(rules["fold_batch_norm"].enabled, FoldBatchNorm()),
            _if(rules["fold_matmul_reshape"].enabled, FoldMatmulReshape()),
            _if(rules["horizontal_matmul"].enabled,
                MergeParallelMatmul(rules["horizontal_matmul"].max_group_size)),
            # ToMixedPrecision cannot type clip's scalar bounds (ReLU6) nor slice_scatter's
            # integer ones (latent attention's rotary part): both rewritten first; the
            # casts of constants it leaves (the bounds) are evaluated after it. It runs before
            # FuseAttention: it has no policy for call_tir and asked the dtype of the kernel
            # itself ("Expected TensorType, but got R.Callable"), so fp16 transformers did not
            # build.
            _if(options.dtype in ("float16", "bfloat16"), tvm.transform.Sequential([
                DecomposeClip(), SliceScatterAsConcat(),
                relax.transform.ToMixedPrecision(out_dtype="float16"),
                _if(options.dtype == "bfloat16", NarrowToBFloat16()),
                _if(rules["store_narrowed"].enabled, StoreNarrowed()),
                # a router's top-k chooses by float32 logits: after StoreNarrowed, which would
                # give its GEMM the narrowed activation again, and before the weights' casts fold
                SelectInFloat32(),
                FoldConstantCasts(),
            ])),
            _attention(family, rules["fused_attention"].enabled),
            *family.layout_passes(rules),
            PointConvAsMatmul(),  # 1x1 convs over 1x1 maps (squeeze-excite): matmuls
            _if(rules["horizontal_conv"].enabled, MergeSummedConv()),
            _if(rules["fold_layout_glue"].enabled, FoldLayoutGlue()),
            # int8: the GEMMs and convs over constant weights quantized, with the ranges the
            # calibration measured; without them, the calibration's own build, which returns
            # the ranges of what would be quantized
            _if(options.dtype == "int8", tvm.transform.Sequential([
                relax.transform.CanonicalizeBindings(),  # a pool's `(out, indices)[0]`
                ObserveQuantized() if options.int8_ranges is None
                else QuantizeInt8(options.int8_ranges)])),
        ])),
        # 2. Canonicalize: what BatchNorm is left becomes arithmetic, and the `(out, mean, var)[0]`
        #    tuple it leaves is folded away so fusion can see through it.
        Phase("canonicalize", tvm.transform.Sequential([
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
        ])),
        # 3. tvmfuse's pattern rules group ops into kernels (conv/matmul epilogues, add+LayerNorm).
        Phase("fuse_patterns", relax.transform.FuseOpsByPattern(
            fusion_patterns(rules, family.row_norm_takes(rules),
                            quantized=options.dtype == "int8" and options.int8_ranges is not None),
            bind_constants=False
        )),
        # 4. Legalize: every Relax op becomes a TIR PrimFunc (scans and sorts through TVM's
        #    dispatch, which LegalizeOps leaves alone; `run` names any op left); constant
        #    subgraphs are folded, and the `(a, b)[1]` that index_tensor's legalization leaves
        #    (with a symbolic sequence the mask is not constant: FuseOps left such an item
        #    outside the kernel that computes `b`, "Var lv25 is not defined").
        Phase("legalize", tvm.transform.Sequential([
            WidenEpilogues(options.accumulator),  # fp16/bf16: bias, activation on the sums
            WidenElementwise(options.accumulator),  # and the elementwise chains outside groups
            _dispatch_scans(backend, tvm_target),
            relax.transform.LegalizeOps(_legalizations(family, rules, options.accumulator)),
            relax.transform.AnnotateTIROpPattern(),
            MarkGathersInjective(),  # embedding lookups and mask gathers join their neighbours
            FoldRemainingConstants(),
            relax.transform.CanonicalizeBindings(),
        ])),
        # 5. TVM's FuseOps groups what the patterns left (elementwise chains, reductions).
        Phase("fuse_ops", _if(rules["elementwise"].enabled, relax.transform.FuseOps())),
        # 6. The numeric gate (--verify-fusion): a group that fails to build or to match its
        #    ops run one by one is split back into them.
        Phase("verify_fusion", _if(options.verify_fusion, VerifyFusion(
            _group_builder(plan), _device_here(plan.target), TOLERANCE,
        ))),
        # 7. Each group becomes one PrimFunc; where the strategy packs weights, the constants it
        #    reads (weights) are marked layout-free, for schedules (ours and MetaSchedule's) to
        #    choose their layout.
        Phase("fuse_tir", tvm.transform.Sequential([
            relax.transform.FuseTIR(),
            _if(prepack, MarkWeightsLayoutFree()),
        ])),
        # 8. Tuned records first (the database), then
        Phase("apply_database", (ApplyDatabase(plan.database, family.scheduler())
                                 if plan.database is not None
                                 else tvm.transform.Sequential([]))),
        # 9. the hand-written rules from schedules/, then TVM's defaults for what is left (see
        #    tvmfuse.strategy);
        Phase("schedule", tvm.transform.Sequential([*family.kernel_passes(rules),
                                                    family.scheduler()])),
        # 10. the weight layouts the schedules chose, computed at build time.
        Phase("prepack", _if(prepack, PrepackWeights())),
        # 11. Lower dataflow to VM instructions and plan memory (TVM's per-target passes).
        Phase("lower", tvm.transform.Sequential(
            backend.dataflow_lower_passes(tvm_target) + backend.finalize_passes(tvm_target)
        )),
    ]
    assert tuple(p.name for p in listed) == PHASES
    return listed


def _legalizations(family: strategy.Strategy, rules: dict[str, Rule],
                   accumulator: str | None) -> dict:
    """The target's own legalizations, with low-precision matmuls and convs summing in
    ``accumulator`` over them."""
    overrides = family.legalize_overrides(rules)
    if accumulator is None:
        return overrides
    return {**overrides, **accumulate.legalizations(overrides, accumulator)}


def _attention(family: strategy.Strategy, enabled: bool) -> tvm.transform.Pass:
    """Attention chains as one kernel each, where the target has the kernel."""
    kernel = family.attention_kernel()
    return FuseAttention(kernel) if enabled and kernel is not None else tvm.transform.Sequential([])


#: The operators TVM's library dispatch lowers (LegalizeOps leaves them alone).
_DISPATCHED = ("relax.cumsum", "relax.cumprod", "relax.sort", "relax.argsort", "relax.topk",
               "relax.bucketize", "relax.multinomial_from_uniform")


def _dispatch_scans(backend, tvm_target) -> tvm.transform.Pass:
    """TVM's dispatch of scans, sorts and sampling, on modules that have them (it rebuilds the
    whole module, and refuses one whose kernels share a global symbol)."""
    dispatch = tvm.transform.Sequential(backend.library_dispatch_passes(tvm_target))

    @tvm.transform.module_pass(opt_level=0, name="DispatchScans")
    def dispatch_scans(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return dispatch(mod) if any(op in _DISPATCHED for op in _operator_calls(mod)) else mod

    return dispatch_scans


def _group_builder(plan: _Plan):
    """Build a module holding one fused group the way the pipeline builds a model."""
    def build_group(mod: tvm.IRModule):
        unverified = replace(plan, options=replace(plan.options, verify_fusion=False))
        for phase in _phases(unverified):
            if phase.on_kernels:
                mod = phase.transform(mod)
        return _lower(mod, plan)

    return build_group


def _lower(mod: tvm.IRModule, plan: _Plan):
    """Compile the scheduled ``mod`` for the plan's target (TIR lowering and codegen, under
    the options of its strategy)."""
    with tvm.transform.PassContext(opt_level=3, config=plan.family.lowering_config()):
        return tvm.compile(mod, target=plan.tvm_target, relax_pipeline=None,
                           tir_pipeline=plan.family.tir_pipeline())


def _device_here(target: TargetSpec):
    return None if target.why_not_runnable() is not None else target.device_here()


def _if(condition: bool, transform: tvm.transform.Pass) -> tvm.transform.Pass:
    return transform if condition else tvm.transform.Sequential([])


def stock(target: tvm.target.Target, database: Path | None) -> tvm.transform.Pass:
    """TVM's own default pipeline for ``target`` (what `tvm.compile` runs), with ``database``
    applied right after its FuseTIR when given: the "stock TVM" baseline of `tvmfuse bench`."""
    backend = relax_backend(target.kind.name)

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


def run(mod: tvm.IRModule, target: TargetSpec, options: BuildOptions, *,
        database: Path | None = None, until: str | None = None, on_phase=None) -> tvm.IRModule:
    """Run the phases on ``mod`` for ``target`` (up to and including ``until``), applying the
    MetaSchedule JSON ``database`` (a folder, resolved by the caller) when given, and calling
    ``on_phase(name, mod)`` after each phase."""
    return _run(_plan(target, options, database), mod, until, on_phase)


def build(mod: tvm.IRModule, target: TargetSpec, options: BuildOptions, *,
          database: Path | None = None, on_phase=None, lowering=None):
    """Run every phase on ``mod`` (as :func:`run` does) and compile the result for ``target``:
    a ``tvm.relax.Executable``. ``lowering()``, when given, is a context the compilation runs
    in (the build's timing of it)."""
    plan = _plan(target, options, database)
    mod = _run(plan, mod, None, on_phase)
    with lowering() if lowering is not None else contextlib.nullcontext():
        return _lower(mod, plan)


def _run(plan: _Plan, mod: tvm.IRModule, until: str | None, on_phase) -> tvm.IRModule:
    # FuseOps' largest group is the elementwise rule's size limit.
    config = {"relax.FuseOps.max_depth": plan.rules["elementwise"].max_group_size,
              **plan.family.pipeline_config(plan.rules)}
    with plan.tvm_target, tvm.transform.PassContext(opt_level=3, config=config):
        for phase in _phases(plan):
            try:
                mod = phase.transform(mod)
            except TvmfuseError:
                raise
            except Exception as err:  # noqa: BLE001 - TVM raises builtin types from C++
                raise CompileError(f"phase {phase.number} ({phase.name}) failed: "
                                   f"{one_line(err)}{_hint(phase.name)}") from err
            if phase.name == "legalize":
                _check_lowered(mod, phase)
            if on_phase is not None:
                on_phase(phase.name, mod)
            if phase.name == until:
                break
    return mod


#: Operators the VM runs itself (calls of kernels and packed functions, shape bookkeeping).
_RUNTIME_OPS = ("relax.call_", "relax.builtin.", "relax.memory.", "relax.vm.", "relax.hint.",
                "relax.invoke_", "relax.null_value", "relax.shape_of", "relax.print",
                "relax.assert_op", "relax.tensor_to_shape", "relax.shape_to_tensor",
                "relax.to_vdevice")


def _operator_calls(mod: tvm.IRModule) -> Counter:
    """Calls of each Relax operator (full name -> count) in ``mod``'s Relax functions."""
    calls = Counter()

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            calls[expr.op.name] += 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return calls


def unlowered_operators(mod: tvm.IRModule) -> Counter:
    """Graph-level operators (name -> calls) left in ``mod``'s Relax functions: after
    legalization, those TVM has no lowering for."""
    return Counter({name.removeprefix("relax."): count
                    for name, count in _operator_calls(mod).items()
                    if not name.startswith(_RUNTIME_OPS)})


def _check_lowered(mod: tvm.IRModule, phase: Phase) -> None:
    """An operator left after legalization would fail VM codegen with "CodeGenVM cannot emit
    this Relax operator directly", naming nothing: name it here."""
    left = unlowered_operators(mod)
    if left:
        ops = ", ".join(f"{name} (x{count})" for name, count in sorted(left.items()))
        raise CompileError(f"phase {phase.number} ({phase.name}): TVM has no lowering for {ops}; "
                           f"replace that operator in the model (a decomposition before export) "
                           f"or report the model")


def _hint(phase: str) -> str:
    """What a user can try when ``phase`` fails."""
    if phase in ("fuse_patterns", "fuse_ops", "fuse_tir"):
        return "; try --fusion-rules with the rule of that group disabled, or --verify-fusion"
    if phase in ("legalize", "lower"):
        return ("; an op may have no lowering in TVM (-v shows the IR and the whole error); "
                "simplify the model there or report it")
    return "; -v shows the whole error"
