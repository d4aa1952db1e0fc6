"""The interface every target family's strategy implements (see :mod:`tvmfuse.strategy`)."""

from __future__ import annotations

import tvm
from tvm import relax

from ..passes import (
    ApplyScheduleRules,
    DecomposeClip,
    FoldConstantsInNumPy,
    FoldRemainingConstants,
    NormalizeNegativeAxes,
    StackAsConcat,
)
from ..rules import Rule
from ..targets import TargetSpec


class Strategy:
    """What a target family decides about a build; every method has the family's answer."""

    def __init__(self, target: TargetSpec):
        self.target = target

    def layout_passes(self, rules: dict[str, Rule]) -> list[tvm.transform.Pass]:
        """Layout conversions and compute overrides, run before fusion (constants folded into
        the new layouts)."""
        return []

    def legalize_overrides(self, rules: dict[str, Rule]) -> dict:
        """Relax op -> the legalization tvmfuse gives it instead of TVM's."""
        return {}

    def kernel_passes(self, rules: dict[str, Rule]) -> list[tvm.transform.Pass]:
        """Passes that give kernels an implementation before the schedule rules run (kernels
        written whole, not scheduled)."""
        return []

    def row_norm_takes(self, rules: dict[str, Rule]):
        """Which matmul calls (``relax.Call -> bool``) may have their output rows normalized in
        their kernel (rule ``layer_norm_epilogue``): float32 ones (the CPU schedule's
        ``DenseRowNorm``, which has not met the casts of a low-precision build)."""
        return lambda call: str(call.args[0].ty.dtype) == "float32"

    def tir_pipeline(self) -> str:
        """The TIR lowering pipeline (a name ``tvm.tirx.get_tir_pipeline`` knows)."""
        return "default"

    def scheduler(self) -> ApplyScheduleRules:
        """The schedule phase: the family's rules in the order they are tried."""
        raise NotImplementedError

    def attention_kernel(self):
        """``AttentionShape -> PrimFunc``: the fused attention kernel (see
        :class:`tvmfuse.passes.FuseAttention`), or None where there is none."""
        return None

    def pipeline_config(self, rules: dict[str, Rule]) -> dict:
        """PassContext options for the pipeline's graph-level phases (TVM's Relax passes)."""
        return {}

    def lowering_config(self) -> dict:
        """PassContext options for lowering the scheduled kernels (``tvm.compile``)."""
        return {}

    def prepacks_weights(self, rules: dict[str, Rule]) -> bool:
        """Whether schedules choose the layout of constant weights (packed at build time)."""
        return False


def nhwc_convs(kernel_layout: str) -> list[tvm.transform.Pass]:
    """Convs converted to NHWC activations with ``kernel_layout`` weights, the weights
    transposed at build time; what ConvertLayout has no rule for is rewritten first, or it
    would wrap each such op in transposes back to NCHW."""
    return [
        DecomposeClip(),  # ConvertLayout has no rule for clip (ReLU6)
        NormalizeNegativeAxes(),  # nor for squeeze's and permute's negative axes
        StackAsConcat(),  # and its rule for stack names an axis no other rule finds
        relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", kernel_layout]}),
        FoldConstantsInNumPy(),  # the weights' transposes
        FoldRemainingConstants(),
    ]
