"""ApplyDefaultSchedule: dlight's default GPU schedules, one kernel at a time, with fallback.

dlight's own pass stops the whole build when a rule raises on one kernel (seen on MobileNetV2's
fused kernels: "consumers of the cache-write stage that are not properly inlined"). Here a rule
that raises is logged and the next rule is tried, down to the last (dlight's Fallback), so one
awkward fused kernel costs speed, not the build.

Preconditions: after FuseTIR (and after applying a tuning database, whose kernels it skips).
"""

from __future__ import annotations

import logging

import tvm
from tvm import tirx

log = logging.getLogger(__name__)


@tvm.transform.module_pass(opt_level=0, name="ApplyDefaultSchedule")
class ApplyDefaultSchedule:
    """Schedule every unscheduled PrimFunc with the first dlight rule that applies and works."""

    def __init__(self, *rules):
        self.rules = rules

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=False)
        updated = mod.clone()
        for gvar, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc) or func.attrs.get("tirx.is_scheduled", False):
                continue
            for rule in self.rules:
                try:
                    space = rule.apply(func, target, False)
                except Exception as err:  # noqa: BLE001 - a rule failing is a reason to try the next
                    log.warning("schedule rule %s failed on %s (%s); trying the next rule",
                                type(rule).__name__, gvar.name_hint,
                                str(err).strip().splitlines()[-1][:160])
                    continue
                if space is None:
                    continue
                sch = space[0] if isinstance(space, list) else space
                updated[gvar] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
                break
        return updated
