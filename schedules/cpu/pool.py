"""Max/average pooling and spatial means in NHWC (ResNet's global average pool): reductions over
H and W with channels innermost, so the register-blocked schedule vectorizes over channels."""

from __future__ import annotations

from ._blocked import register_blocked
from ._tir import CpuRule


def _is_pool(name: str) -> bool:
    # LegalizeOps names a mean's (or sum's) reduction block after its input: "<input>_red".
    return name.startswith(("pool_", "adaptive_pool", "T_pool")) or name.endswith("_red")


class Pool(CpuRule):
    name = "cpu.pool"

    def apply(self, func, target, tunable):
        return register_blocked(func, self.vector, _is_pool)
