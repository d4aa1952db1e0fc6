"""Operator strategy: which implementation each fused kernel gets on a target.

Three levers, applied in this order by the pipeline:

1. **Compute and layout** (before fusion): the ``conv_layout_nhwc`` rule converts convs to NHWC
   activations, so channels are the contiguous axis (vectorized on CPUs, the reduction axis that
   the tensor-core schedule copies 16 bytes at a time on CUDA), with HWIO weights on CPUs and
   OHWI on CUDA, transposed once at build time (FoldConstant), not at run time.
2. **Schedules** (after FuseTIR), by precedence: a record from the tuning database, then the
   first hand-written rule from ``schedules/`` that fits the kernel, then TVM's defaults (dlight
   on GPUs).
3. **Report**: :func:`implementations` reads back which of them every kernel got.

Each target family answers the questions of levers 1 and 2 in a module of its own
(:mod:`.cpu`, :mod:`.cuda`) behind one interface, :class:`.base.Strategy`; :func:`for_target`
picks it.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .. import names
from ..passes import ApplyScheduleRules
from ..passes.apply_database import root_annotation, seed_rule
from ..targets import TargetSpec
from .base import Strategy
from .cpu import CpuStrategy
from .cuda import CudaStrategy

#: What a kernel that no rule scheduled and no record covered runs with: TVM's plain lowering.
DEFAULT = "default"
#: What a kernel scheduled by a searched tuning database record runs with: ``tuned`` (a record
#: of MetaSchedule's generic space) or ``tuned:<rule>@<version>`` (of a rule's design space).
TUNED = "tuned"
#: Prefix of a kernel whose database record is a measured hand-written seed ("seed:cpu.conv2d").
DATABASE_SEED = "seed"


def for_target(target: TargetSpec) -> Strategy:
    """The strategy of ``target``'s family."""
    return CudaStrategy(target) if target.is_gpu else CpuStrategy(target)


def scheduler(target: TargetSpec) -> ApplyScheduleRules:
    """The schedule phase for ``target`` (what ``tvmfuse tune`` seeds with, too)."""
    return for_target(target).scheduler()


def implementations(mod: tvm.IRModule) -> dict[str, str]:
    """Kernel name -> the implementation it was built with: ``tuned`` or
    ``tuned:<rule>@<version>`` (a searched database record, see TUNED), ``seed:<rule>`` (a
    database record that is a measured hand-written seed), a hand-written rule's name
    (``cpu.conv2d``), a dlight rule (``dlight.Matmul``) or ``default``."""
    found = {}
    for gvar, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        attrs = func.attrs or {}
        if names.SCHEDULE in attrs:
            found[gvar.name_hint] = str(attrs[names.SCHEDULE])
        elif attrs.get(names.IS_SCHEDULED, False):
            seed, space = seed_rule(func), root_annotation(func, names.SPACE)
            found[gvar.name_hint] = (f"{DATABASE_SEED}:{seed}" if seed is not None else
                                     f"{TUNED}:{space}" if space is not None else TUNED)
        else:
            found[gvar.name_hint] = DEFAULT
    return found
