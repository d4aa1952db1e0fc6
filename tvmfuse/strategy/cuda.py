"""The CUDA strategy: NHWC convs with OHWI weights, tvmfuse's tensor-core GEMM for fp16 matmuls
and convs and its attention kernel (``schedules/cuda/``), dlight's GPU rules for the other
kernels."""

from __future__ import annotations

import tvm
from tvm.s_tir import dlight as dl

from ..passes import ApplyScheduleRules
from ..schedules.cuda.attention import attention_kernel
from ..schedules.cuda.matmul import TensorCoreMatmul
from ..schedules.cuda.rows import WarpRows
from ..rules import Rule
from .base import Strategy, nhwc_convs


class CudaStrategy(Strategy):
    def layout_passes(self, rules: dict[str, Rule]) -> list[tvm.transform.Pass]:
        """Convs in NHWC with OHWI weights (``conv_layout_nhwc``): as an implicit GEMM the
        input's contiguous axis is then the reduction's (C), which the tensor-core schedule
        copies to shared memory 16 bytes a thread, and the weight is stored K-major."""
        if not rules["conv_layout_nhwc"].enabled:
            return []
        return nhwc_convs("OHWI")

    def scheduler(self) -> ApplyScheduleRules:
        """fp16 matmuls and convs on tensor cores (``schedules/cuda/matmul.py``), row
        reductions up to 1024 long a warp per row (``schedules/cuda/rows.py``), then dlight's
        rules; kernels whose reductions are tiny (see ApplyScheduleRules) try the
        tensor cores too (a 1x1 conv over 40 channels is a GEMM with K = 40 and thousands of
        rows; the rule leaves a depthwise conv's one channel a group), then Fallback."""
        mma = TensorCoreMatmul("float16")
        return ApplyScheduleRules(
            [mma, dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), WarpRows(),
             dl.gpu.GeneralReduction(), dl.gpu.Fallback()],
            small_reduction_rules=[mma, dl.gpu.Fallback()])

    def pipeline_config(self, rules: dict[str, Rule]) -> dict:
        """``cuda_graph``: the VM function's runs of kernels between allocations it plans
        statically, captured as CUDA graphs on the first call and replayed after
        (RewriteCUDAGraph): at batch 1 a model's 50-150 launches cost more host time than the
        GPU spends on them (BERT-base fp16 b1 on the H200: 1.07 -> 0.87 ms)."""
        return {"relax.backend.use_cuda_graph": rules["cuda_graph"].enabled}

    def lowering_config(self) -> dict:
        """Copies that the schedules pipeline (``software_pipeline_async_stages``) as cp.async:
        TVM emits it only under this option."""
        return {"tirx.use_async_copy": True}

    def attention_kernel(self):
        return attention_kernel
