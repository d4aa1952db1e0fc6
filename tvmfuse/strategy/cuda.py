"""The CUDA strategy: NHWC convs with OHWI weights, tvmfuse's tensor-core GEMM for fp16 matmuls
and convs and its attention kernel (``schedules/cuda/``), dlight's GPU rules for the other
kernels."""

from __future__ import annotations

import functools
import math

import tvm
from tvm.s_tir import dlight as dl

from ..names import TIRX_KERNEL
from ..passes import ApplyScheduleRules, SpaceToDepthConv, UseWgmmaGemms
from ..passes._rewrite import static_shape
from ..passes.propagate_nan import PropagateNaN
from ..rules import Rule
from ..schedules.cuda.attention import attention_kernel
from ..schedules.cuda.matmul import TensorCoreMatmul
from ..schedules.cuda.rows import WarpRows
from .base import Strategy, nhwc_convs

#: The TIR pipeline of CUDA builds: TIRx's for the kernels written in TIRx, s_tir's for the rest,
#: every float max/min then made to propagate NaN (``tvmfuse.passes.propagate_nan``).
MIXED_PIPELINE = "tvmfuse.cuda"


class CudaStrategy(Strategy):
    def layout_passes(self, rules: dict[str, Rule]) -> list[tvm.transform.Pass]:
        """Convs in NHWC with OHWI weights (``conv_layout_nhwc``): as an implicit GEMM the
        input's contiguous axis is then the reduction's (C), which the tensor-core schedule
        copies to shared memory 16 bytes a thread, and the weight is stored K-major; strided
        convs over fewer than 8 channels (the stem) over a space-to-depth input
        (``space_to_depth_conv``), so that those copies hold for them too."""
        if not rules["conv_layout_nhwc"].enabled:
            return []
        stem = [SpaceToDepthConv()] if rules["space_to_depth_conv"].enabled else []
        return [*nhwc_convs("OHWI"), *stem]

    def kernel_passes(self, rules: dict[str, Rule]) -> list[tvm.transform.Pass]:
        """Large fp16 GEMMs over constant weights as Hopper wgmma kernels
        (``schedules/cuda/wgmma.py``, rule ``wgmma_gemm``), on an sm_90a target; with rule
        ``mma_gemm``, GEMMs the wgmma kernel does not take as the hand-written mma.sync kernel
        (``schedules/cuda/mma_gemm.py``) where it has a tile for them."""
        wgmma, mma = rules["wgmma_gemm"].enabled, rules["mma_gemm"].enabled
        if not (wgmma or mma):
            return []
        return [UseWgmmaGemms(tvm.target.Target({**self.target.config, "arch": "sm_90a"}),
                              wgmma=wgmma, mma=mma, gpu=self.target.gpu)]

    def row_norm_takes(self, rules: dict[str, Rule]):
        """Only the GEMMs the wgmma kernel normalizes in its epilogue (rule ``wgmma_gemm``):
        fp16 or bf16, B a constant, shapes :meth:`UseWgmmaGemms.takes_row_norm` takes; no
        other CUDA schedule computes a GEMM with a row reduction after it."""
        if not rules["wgmma_gemm"].enabled:
            return lambda call: False
        passes = self.kernel_passes(rules)

        def takes(call) -> bool:
            x, weight = call.args
            shape = static_shape(getattr(x.ty, "shape", None))
            out = static_shape(getattr(call.ty, "shape", None))
            if (shape is None or out is None or not isinstance(weight, tvm.ir.expr.Constant)
                    or str(x.ty.dtype) not in ("float16", "bfloat16")):
                return False
            return passes[0].takes_row_norm(math.prod(shape[:-1]), out[-1], shape[-1])

        return takes

    def tir_pipeline(self) -> str:
        return MIXED_PIPELINE

    def scheduler(self) -> ApplyScheduleRules:
        """fp16 matmuls and convs on tensor cores (``schedules/cuda/matmul.py``), row
        reductions up to 1024 long a warp per row (``schedules/cuda/rows.py``), then dlight's
        rules; kernels whose reductions are tiny (see ApplyScheduleRules) try the
        tensor cores too (a 1x1 conv over 40 channels is a GEMM with K = 40 and thousands of
        rows; the rule leaves a depthwise conv's one channel a group), then Fallback."""
        mma = TensorCoreMatmul("float16", gpu=self.target.gpu)
        return ApplyScheduleRules(
            [mma, dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), WarpRows(),
             dl.gpu.GeneralReduction(), dl.gpu.Fallback()],
            small_reduction_rules=[mma, dl.gpu.Fallback()])

    def pipeline_config(self, rules: dict[str, Rule]) -> dict:
        """``cuda_graph``: the VM function's runs of kernels between allocations it plans
        statically, captured as CUDA graphs on the first call and replayed after
        (RewriteCUDAGraph): at batch 1 a model's 50-150 launches cost more host time than the
        GPU spends on them (``python -m tvmfuse bench bert-base --target cuda-sm90 --dtype fp16``
        with the rule on and off)."""
        return {"relax.backend.use_cuda_graph": rules["cuda_graph"].enabled}

    def lowering_config(self) -> dict:
        """Copies that the schedules pipeline (``software_pipeline_async_stages``) as cp.async:
        TVM emits it only under this option."""
        return {"tirx.use_async_copy": True}

    def attention_kernel(self):
        return functools.partial(attention_kernel, gpu=self.target.gpu)


def _mixed_pipeline():
    """TIRx's lowering for the functions marked ``TIRX_KERNEL``, s_tir's for the others; both
    end in the same host and device finalization."""
    import tvm.s_tir.pipeline  # noqa: F401, PLC0415 - registers the s_tir pipeline
    from tvm.tirx import compilation_pipeline  # noqa: PLC0415

    s_tir, finalize_host, finalize_device = compilation_pipeline.get_tir_pipeline("s_tir")
    tirx = compilation_pipeline.get_tir_pipeline("tirx")[0]

    def written_in_tirx(func) -> bool:
        return bool(func.attrs and func.attrs.get(TIRX_KERNEL, False))

    @tvm.transform.module_pass(opt_level=0, name="MixedTIRPipeline")
    def mixed(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        written = tvm.tirx.transform.Filter(written_in_tirx)(mod)
        if not written.functions:
            return s_tir(mod)
        lowered = s_tir(tvm.tirx.transform.Filter(lambda f: not written_in_tirx(f))(mod))
        for gvar, func in tirx(written).functions.items():
            lowered[gvar] = func
        return lowered

    nan = PropagateNaN(vectors=False)  # CUDA's code generator has no vector of booleans
    return tvm.transform.Sequential([mixed, nan]), finalize_host, finalize_device


tvm.tirx.compilation_pipeline.register_tir_pipeline(MIXED_PIPELINE, _mixed_pipeline)

