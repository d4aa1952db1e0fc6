"""What the dot-product instructions of the register-blocked tiles share (:mod:`.bf16_dot`,
:mod:`.int8_dot`; ``DOT_INSTRUCTIONS`` in :mod:`._blocked`): the TensorIR description the
tile's innermost ``lanes x group`` block is matched against. Each instruction's module names its
LANES, GROUP (products a lane sums per step), INPUTS and ACCUMULATOR types, INTRIN, and says
whether a core has it (``available``) and what a kernel calling it must link (``link``).
"""

from __future__ import annotations

from tvm.script import tirx as T


def description(inputs: tuple[str, str], accumulator: str, lanes: int, group: int):
    """The PrimFunc ``C[i] += accumulator(A[k]) * accumulator(B[i, k])`` over ``lanes``
    accumulators and ``group`` reduction steps, A and B of the ``inputs`` types. Indices are
    int64, as in Relax's kernels: tensorize matches a description's index types exactly."""
    data, weight = inputs
    _0, _lanes, _group = (T.int64(n) for n in (0, lanes, group))

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((_group,), data, offset_factor=1),
             B: T.Buffer((_lanes, _group), weight, offset_factor=1),
             C: T.Buffer((_lanes,), accumulator, offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(C[_0:_lanes], A[_0:_group], B[_0:_lanes, _0:_group])
            T.writes(C[_0:_lanes])
            for i in T.serial(_0, _lanes):
                for k in T.serial(_0, _group):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + (T.Cast(accumulator, A[vk])
                                         * T.Cast(accumulator, B[vi, vk]))

    return desc
