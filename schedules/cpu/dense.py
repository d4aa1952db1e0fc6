"""Matmul, dense and batched matmul with a ``[..., K, N]`` right operand (linear layers after
FoldConstant has transposed their weights at build time), with the fused bias/activation/residual
epilogue: the register-blocked schedule over output columns x rows.

A transposed operand read along its reduction axis (``q @ k.T``) does not fit: the transpose
stays a separate kernel, which this rule's input then is.
"""

from __future__ import annotations

from ._blocked import register_blocked
from ._tir import CpuRule


_ANCHORS = ("matmul", "NT_matmul", "T_matmul", "T_dense", "T_batch_matmul")


class Dense(CpuRule):
    name = "cpu.dense"

    def apply(self, func, target, tunable):
        return register_blocked(func, self.vector, lambda name: name.startswith(_ANCHORS))
