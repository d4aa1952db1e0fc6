"""ApplyScheduleRules: the first schedule rule that fits each kernel, with fallback, and a record
of which one it was.

The rules are dlight ``ScheduleRule``s: tvmfuse's hand-written CPU schedules
(:mod:`tvmfuse.schedules.cpu`) or dlight's GPU rules (see :mod:`tvmfuse.strategy`). Every kernel
this pass schedules carries the rule's name in its ``tvmfuse.schedule`` attribute, so the build
can report the implementation each kernel got.

dlight's own pass stops the whole build when a rule raises on one kernel (seen on MobileNetV2's
fused kernels: "consumers of the cache-write stage that are not properly inlined"). Here a rule
that raises is logged and the next rule is tried, down to the last (dlight's Fallback), so one
awkward fused kernel costs speed, not the build.

A kernel whose reductions are tiny (a depthwise 3x3 conv reduces over 9 elements) goes straight
to the ``small_reduction_rules``: dlight's GeneralReduction would spread those 9 elements over a
thread block. Measured on an H200, MobileNetV2's fused depthwise conv+bias+ReLU6 kernels under
GeneralReduction made the model 2.5x slower than stock TVM, whose unfused depthwise convs dlight
happens to give to Fallback (one thread per output).

Preconditions: after FuseTIR (and after applying a tuning database, whose kernels it skips).
"""

from __future__ import annotations

import logging
import math

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func

from ..names import IS_SCHEDULED, SCHEDULE

log = logging.getLogger(__name__)


def rule_name(rule) -> str:
    """``rule.name`` for tvmfuse's rules, ``dlight.<Class>`` for dlight's."""
    return getattr(rule, "name", None) or f"dlight.{type(rule).__name__}"


@tvm.transform.module_pass(opt_level=0, name="ApplyScheduleRules")
class ApplyScheduleRules:
    """Schedule every unscheduled PrimFunc with the first rule that applies and works."""

    def __init__(self, rules, small_reduction_rules=(), small_reduction: int = 64):
        self.rules = list(rules)
        self.small_reduction_rules = list(small_reduction_rules)
        self.small_reduction = small_reduction

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=False)
        updated = mod.clone()
        for gvar, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc) or func.attrs.get(IS_SCHEDULED, False):
                continue
            found = self.schedule(func, target, gvar.name_hint)
            if found is not None:
                name, sch = found
                updated[gvar] = sch.mod["main"].with_attrs(
                    {IS_SCHEDULED: True, SCHEDULE: name})
                log.debug("%s scheduled by %s", gvar.name_hint, name)
        return updated

    def rule(self, name: str):
        """The rule called ``name`` (its :func:`rule_name`), or None."""
        return next((r for r in (*self.rules, *self.small_reduction_rules)
                     if rule_name(r) == name), None)

    def schedule(self, func: tirx.PrimFunc, target, kernel: str = "main"):
        """The name of the first rule that schedules ``func`` and its schedule, or None.

        What the build gives one kernel; ``tvmfuse tune`` seeds its records with the same."""
        if not _has_root_block(func):  # written without blocks (topi's topk, a sort): no rule
            log.debug("%s has no root block: left to TVM's default schedule", kernel)
            return None
        rules = self.rules
        if self.small_reduction_rules and 0 < _reduction_size(func) <= self.small_reduction:
            rules = self.small_reduction_rules
        for rule in rules:
            try:
                space = rule.apply(func, target, False)
            except Exception as err:  # noqa: BLE001 - a rule failing is a reason to try the next
                log.warning("schedule rule %s failed on %s (%s); trying the next rule",
                            rule_name(rule), kernel, str(err).strip().splitlines()[-1][:160])
                continue
            if space is not None:
                return rule_name(rule), space[0] if isinstance(space, list) else space
        return None


def _has_root_block(func: tirx.PrimFunc) -> bool:
    try:
        s_tir.Schedule(func).get_sblock("root")
    except Exception:  # noqa: BLE001 - the schedule's error for a function without blocks
        return False
    return True


def _reduction_size(func: tirx.PrimFunc) -> int:
    """Elements the largest reduction of ``func`` reduces over (0: no reduction, or unknown)."""
    try:
        blocks = normalize_prim_func(s_tir.Schedule(func))
    except Exception:  # noqa: BLE001 - an unusual kernel is simply not a small reduction
        return 0
    sizes = [math.prod(int(i.dom) for i in b.iters if i.kind == "R")
             for b in blocks or [] if any(i.kind == "R" for i in b.iters)
             and all(isinstance(i.dom, (int, tirx.IntImm)) for i in b.iters)]
    return max(sizes, default=0)
