"""Row reductions (softmax, LayerNorm, RMSNorm) with one warp per row: dlight's
``GeneralReduction`` schedule with its reduction threads cut from 256 to the warp's 32.

dlight gives each row a block of 256 threads: a row of 128 (BERT's attention scores) leaves half
of them idle, and every reduction (a softmax has two, max and sum) crosses eight warps through
shared memory with two barriers. With 32 threads the reductions are warp shuffles alone and each
lane takes ``row / 32`` elements. Short rows are where it matters: BERT-base's fused
scale+mask+softmax at batch 32 is 49152 rows of 128, which dlight's schedule runs far from the
memory's bandwidth (``python -m tvmfuse inspect bert-base --target cuda-sm90 --dtype fp16
--batch 32 --profile`` times each kernel; ``python3 benchmarks/cuda_row_norm.py`` times the
LayerNorm this schedule gives beside the GEMM before it).

The schedule is dlight's, replayed with the one factor changed (the trace's splits by 256), so
that it follows dlight's handling of the fused producers and consumers; rows longer than
:data:`MAX_ROW` keep dlight's block-wide reduction.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir.dlight.gpu import GeneralReduction
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.s_tir.dlight.gpu.matmul import get_index_map
from tvm.s_tir.schedule import Instruction, Trace

#: The name a kernel of this file reports as its implementation.
NAME = "cuda.warp_rows"
WARP = 32
#: dlight's reduction threads on CUDA.
DLIGHT_THREADS = 256
#: Rows up to this long take a warp (32 elements a lane at most).
MAX_ROW = 1024


class WarpRows(GPUScheduleRule):
    """The schedule rule; see the module docstring."""

    name = NAME

    def apply(self, func: tirx.PrimFunc, target, tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        if not _rows_fit(func):
            return None
        dlight = GeneralReduction().apply(func, target, tunable)
        if not isinstance(dlight, s_tir.Schedule):
            return None
        sch = s_tir.Schedule(func)
        _warp_wide(dlight.trace).apply_to_schedule(sch, remove_postproc=False)
        return sch


def _rows_fit(func: tirx.PrimFunc) -> bool:
    """``func`` reduces rows, each over at most :data:`MAX_ROW` elements (static), and none of
    its reductions is a matmul (dlight's index maps find one: a batched matmul the tensor-core
    rule declined is no row reduction)."""
    sch = s_tir.Schedule(func)
    rows = []
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        stmt = sch.get(block)
        reduced = [iv.dom.extent for iv in stmt.iter_vars
                   if iv.iter_type == tirx.IterVar.CommReduce]
        if reduced and get_index_map(stmt) is not None:
            return False
        if reduced:
            rows.append(reduced)
    return bool(rows) and all(
        all(isinstance(e, tirx.IntImm) for e in row)
        and math.prod(int(e) for e in row) <= MAX_ROW for row in rows)


def _warp_wide(trace: Trace) -> Trace:
    """``trace`` with every split factor of 256 (dlight's threads) replaced by 32."""
    insts = []
    for inst in trace.insts:
        if inst.kind.name == "Split":
            inputs = [tirx.IntImm(str(x.ty.dtype), WARP)
                      if isinstance(x, tirx.IntImm) and int(x) == DLIGHT_THREADS else x
                      for x in inst.inputs]
            inst = Instruction(inst.kind, inputs, inst.attrs, inst.outputs)
        insts.append(inst)
    return Trace(insts, {})
