"""The CPU strategy (AVX-512, x86-64, NEON): NHWC convs with weights transposed and packed at
build time, Winograd 3x3 convs where the rules file enables them, GELU's erf as a polynomial, and
the hand-written schedules of ``schedules/cpu/``."""

from __future__ import annotations

import functools
import math

import tvm
from tvm import relax, te, tirx, topi

from ..passes import (
    ApplyScheduleRules,
    FoldConstantsInNumPy,
    FoldRemainingConstants,
    PadConvChannels,
    WinogradConv2D,
    part_tail,
)
from ..passes.propagate_nan import PropagateNaN
from ..rules import Rule
from ..schedules import cpu
from ..schedules.cpu.attention import attention_kernel
from . import whole_vectors
from .base import Strategy, nhwc_convs

#: The TIR pipeline of CPU builds: s_tir's, the kernels whose last column tile is partial split
#: first (``tvmfuse.passes.part_tail``), every float max/min then made to propagate NaN
#: (``tvmfuse.passes.propagate_nan``).
CPU_PIPELINE = "tvmfuse.cpu"


class CpuStrategy(Strategy):
    def tir_pipeline(self) -> str:
        return CPU_PIPELINE

    def layout_passes(self, rules: dict[str, Rule]) -> list[tvm.transform.Pass]:
        """Convs in NHWC/HWIO (``conv_layout_nhwc``), the weights folded into it, their output
        channels padded to whole vectors (PadConvChannels); with ``winograd_conv2d`` (which
        needs NHWC) 3x3 stride-1 convs as Winograd F(2x2, 3x3)."""
        if not rules["conv_layout_nhwc"].enabled:
            return []
        vector = self.target.vector
        return [*nhwc_convs("HWIO"), PadConvChannels(vector.lanes, vector.dot_bf16),
                FoldConstantsInNumPy(), FoldRemainingConstants(),
                *([WinogradConv2D()] if rules["winograd_conv2d"].enabled else [])]

    def legalize_overrides(self, rules: dict[str, Rule]) -> dict:
        """``fast_erf``: GELU's ``erf`` as ``topi.fast_erf``, a rational polynomial in plain
        arithmetic (error about 1e-7). TVM's own GELU calls ``erf``, which LLVM has no vector
        form of: the generated code calls libm's ``erff`` once per lane, 16 calls per vector in
        the epilogue of BERT's FFN GEMM. ``fast_exp``: sigmoid as ``1 / (1 + fast_exp(-x))``
        for the same reason (``expf`` per lane, which slowed EfficientNet's expansion convs with
        their SiLU epilogues several times over); and the tanh GELU with ``topi.fast_tanh``
        (GPT-2's FFN epilogue). A lone tanh stays TVM's: ``fast_tanh`` there would change BERT's
        pooler kernel, whose committed tuning records were measured on other CPUs than the one
        that would have to measure them again."""
        overrides = {}
        if rules["fast_erf"].enabled:
            overrides["relax.nn.gelu"] = _fast_gelu
        if rules["fast_exp"].enabled:
            # SiLU is x * sigmoid(x) once exported; named as TVM names its own (the build report
            # lists it)
            overrides["relax.sigmoid"] = _float32_te(lambda x: tirx.const(1.0, "float32") / (
                tirx.const(1.0, "float32") + topi.fast_exp(-x)), "tir_sigmoid")
            overrides["relax.nn.gelu_tanh"] = _float32_te(_gelu_tanh, "gelu_tanh")  # GPT-2's
        if rules["whole_vector_rows"].enabled:
            overrides.update(whole_vectors.legalizations(self.target.vector.lanes))
        return overrides

    def scheduler(self) -> ApplyScheduleRules:
        return ApplyScheduleRules(cpu.rules(self.target.vector))

    def attention_kernel(self):
        vector = self.target.vector
        return functools.partial(attention_kernel, lanes=vector.lanes, registers=vector.registers,
                                 cores=int(self.target.config.get("num-cores", 1)))

    def prepacks_weights(self, rules: dict[str, Rule]) -> bool:
        return rules["prepack_weights"].enabled


def _float32_te(compute, name: str):
    """A legalization computing ``compute`` (float32 in, float32 out) on the call's input, in
    float32 whatever its dtype (the fast polynomials are float32's)."""
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        def te_compute(x: te.Tensor) -> te.Tensor:
            if x.dtype == "float32":
                return compute(x)
            return topi.cast(compute(topi.cast(x, "float32")), x.dtype)

        return bb.call_te(te_compute, call.args[0], primfunc_name_hint=name)

    return legalize


def _gelu_tanh(x: te.Tensor) -> te.Tensor:
    """``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`` with ``topi.fast_tanh``."""
    def c(value):
        return tirx.const(value, "float32")

    inner = c(math.sqrt(2.0 / math.pi)) * (x + c(0.044715) * x * x * x)
    return c(0.5) * x * (c(1.0) + topi.fast_tanh(inner))


def _fast_gelu(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    def gelu(x: te.Tensor) -> te.Tensor:
        half = tirx.const(0.5, x.dtype)
        scaled = x * tirx.const(0.5**0.5, x.dtype)
        if x.dtype == "float32":
            erf = topi.fast_erf(scaled)
        else:  # fast_erf is float32's; other dtypes compute it in float32
            erf = topi.cast(topi.fast_erf(topi.cast(scaled, "float32")), x.dtype)
        return x * (half + erf * half)

    return bb.call_te(gelu, call.args[0], primfunc_name_hint="gelu")


def _cpu_pipeline():
    import tvm.s_tir.pipeline  # noqa: F401, PLC0415 - registers the s_tir pipeline

    s_tir, finalize_host, finalize_device = tvm.tirx.compilation_pipeline.get_tir_pipeline("s_tir")
    return (tvm.transform.Sequential([part_tail.lowering(s_tir), PropagateNaN()]), finalize_host,
            finalize_device)


tvm.tirx.compilation_pipeline.register_tir_pipeline(CPU_PIPELINE, _cpu_pipeline)
