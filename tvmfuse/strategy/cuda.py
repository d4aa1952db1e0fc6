"""The CUDA strategy: NCHW layouts as imported, dlight's GPU rules for the schedules, and
tvmfuse's attention kernel (``schedules/cuda/``)."""

from __future__ import annotations

from tvm.s_tir import dlight as dl

from ..passes import ApplyScheduleRules
from ..schedules.cuda.attention import attention_kernel
from .base import Strategy


class CudaStrategy(Strategy):
    def scheduler(self) -> ApplyScheduleRules:
        """dlight's rules, and Fallback for kernels whose reductions are tiny (see
        ApplyScheduleRules)."""
        return ApplyScheduleRules(
            [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
             dl.gpu.Fallback()],
            small_reduction_rules=[dl.gpu.Fallback()])

    def attention_kernel(self):
        return attention_kernel
