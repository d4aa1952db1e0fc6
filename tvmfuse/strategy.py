"""Operator strategy: which implementation each fused kernel gets on a target.

Three levers, applied in this order by the pipeline:

1. **Compute and layout** (before fusion): on CPUs the ``conv_layout_nhwc`` rule converts convs
   to NHWC activations with HWIO weights, so channels are the contiguous, vectorizable axis and
   the weights are transposed once at build time (FoldConstant), not at run time.
2. **Schedules** (after FuseTIR), by precedence: a record from the tuning database, then the
   first hand-written rule from ``schedules/`` that fits the kernel, then TVM's defaults (dlight
   on GPUs). :func:`scheduler` holds the hand-written and default rules per target.
3. **Report**: :func:`implementations` reads back which of them every kernel got.
"""

from __future__ import annotations

import functools

import tvm
from tvm import relax, tirx

from .passes import ApplyScheduleRules, DecomposeClip, WinogradConv2D
from .passes.apply_schedule_rules import SCHEDULE_ATTR
from .targets import TargetSpec

#: What a kernel that no rule scheduled and no record covered runs with: TVM's plain lowering.
DEFAULT = "default"
#: What a kernel scheduled by a searched tuning database record runs with.
TUNED = "tuned"
#: Prefix of a kernel whose database record is a measured hand-written seed ("seed:cpu.conv2d").
DATABASE_SEED = "seed"


def layout_passes(target: TargetSpec, nhwc: bool, winograd: bool = False
                  ) -> list[tvm.transform.Pass]:
    """Layout conversions and compute overrides for ``target``; constants (the weights) are
    folded into the new layout. ``winograd`` (which needs NHWC) computes 3x3 stride-1 convs as
    Winograd F(2x2, 3x3)."""
    if not nhwc or target.vector is None:
        return []
    return [
        DecomposeClip(),  # ConvertLayout has no rule for clip (ReLU6)
        relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "HWIO"]}),
        relax.transform.FoldConstant(),
        *([WinogradConv2D()] if winograd else []),
    ]


def legalize_overrides(target: TargetSpec, fast_erf: bool) -> dict:
    """Relax op -> the legalization tvmfuse gives it instead of TVM's, for ``target``.

    ``fast_erf``: GELU's ``erf`` as ``topi.fast_erf``, a rational polynomial in plain arithmetic
    (error about 1e-7). TVM's own GELU calls ``erf``, which LLVM has no vector form of: the
    generated code calls libm's ``erff`` once per lane, 16 calls per vector in the epilogue of
    BERT's FFN GEMM. CPUs only: CUDA has a fast ``erff`` of its own.
    """
    if not fast_erf or target.device == "cuda":
        return {}
    return {"relax.nn.gelu": _fast_gelu}


def _fast_gelu(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    from tvm import te, topi  # noqa: PLC0415

    def gelu(x: te.Tensor) -> te.Tensor:
        half = tirx.const(0.5, x.dtype)
        scaled = x * tirx.const(0.5**0.5, x.dtype)
        if x.dtype == "float32":
            erf = topi.fast_erf(scaled)
        else:  # fast_erf is float32's; other dtypes compute it in float32
            erf = topi.cast(topi.fast_erf(topi.cast(scaled, "float32")), x.dtype)
        return x * (half + erf * half)

    return bb.call_te(gelu, call.args[0], primfunc_name_hint="gelu")


def scheduler(target: TargetSpec) -> ApplyScheduleRules:
    """The schedule phase for ``target``: its rules in the order they are tried, and on GPUs the
    rules for kernels whose reductions are tiny (see ApplyScheduleRules)."""
    if target.device == "cuda":
        from tvm.s_tir import dlight as dl  # noqa: PLC0415

        return ApplyScheduleRules(
            [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
             dl.gpu.Fallback()],
            small_reduction_rules=[dl.gpu.Fallback()])
    from .schedules import cpu  # noqa: PLC0415

    return ApplyScheduleRules(cpu.rules(target.vector))


def attention_kernel(target: TargetSpec):
    """``AttentionShape -> PrimFunc``: the target's fused attention kernel (see
    :class:`tvmfuse.passes.FuseAttention`), or None where there is none."""
    if target.device == "cuda":
        from .schedules.cuda.attention import attention_kernel as cuda_kernel  # noqa: PLC0415

        return cuda_kernel
    if target.vector is None:
        return None
    from .schedules.cpu.attention import attention_kernel as cpu_kernel  # noqa: PLC0415

    return functools.partial(cpu_kernel, lanes=target.vector.lanes,
                             cores=int(target.config.get("num-cores", 1)))


def implementations(mod: tvm.IRModule) -> dict[str, str]:
    """Kernel name -> the implementation it was built with: ``tuned`` (a searched database
    record), ``seed:<rule>`` (a database record that is a measured hand-written schedule), a
    hand-written rule's name (``cpu.conv2d``), a dlight rule (``dlight.Matmul``) or ``default``."""
    found = {}
    for gvar, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        attrs = func.attrs or {}
        if SCHEDULE_ATTR in attrs:
            found[gvar.name_hint] = str(attrs[SCHEDULE_ATTR])
        elif attrs.get("tirx.is_scheduled", False):
            seed = _seed_rule(func)
            found[gvar.name_hint] = TUNED if seed is None else f"{DATABASE_SEED}:{seed}"
        else:
            found[gvar.name_hint] = DEFAULT
    return found


def _seed_rule(func) -> str | None:
    """The hand-written rule a database record's schedule came from (``tvmfuse tune`` seeds
    annotate the root block with it), or None for a searched schedule."""
    block = getattr(func.body, "block", None)
    annotations = getattr(block, "annotations", None) or {}
    value = annotations.get(SCHEDULE_ATTR)
    return None if value is None else str(value)
