"""The uint8 x int8 quad dot product of AVX-512 VNNI (``vpdpbusd``) as a TensorIR intrinsic.

One instruction takes sixteen int32 accumulators, one quad of uint8 inputs (broadcast to all
sixteen lanes) and sixteen quads of int8 weights, and adds to each accumulator the four products
of its quad: 64 multiply-adds where a float32 FMA does 16. The register-blocked GEMMs and convs
of an int8 build (:func:`tvmfuse.schedules.cpu._blocked.block_anchor`) tensorize their innermost
``16 lanes x 4 reduction steps`` with it, reading weights packed as ``[.., k // 4, 16, k % 4]``.

TVM ships the same instruction (``tvm.s_tir.tensor_intrin.x86``, ``dot_16x4_vnni``), described
with int32 indices; tensorize matches a description's index types exactly and Relax's kernels
index in int64, so it is described again here in int64 (:func:`._dot.description`). Unlike
bf16's (:mod:`.bf16_dot`), every type is one LLVM has, so the LLVM intrinsic is called directly.
"""

from __future__ import annotations

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ._dot import description

#: Int32 lanes of one accumulator vector, and the uint8 x int8 products each lane sums per step.
LANES, GROUP = 16, 4
#: The input's and the weight's element types, and the accumulators'.
INPUTS, ACCUMULATOR = ("uint8", "int8"), "int32"
_0, _LANES, _GROUP = (T.int64(n) for n in (0, LANES, GROUP))


@T.prim_func(s_tir=True)
def _impl(A: T.Buffer((_GROUP,), "uint8", offset_factor=1),
          B: T.Buffer((_LANES, _GROUP), "int8", offset_factor=1),
          C: T.Buffer((_LANES,), "int32", offset_factor=1, scope="local")) -> None:
    with T.sblock("root"):
        T.reads(C[_0:_LANES], A[_0:_GROUP], B[_0:_LANES, _0:_GROUP])
        T.writes(C[_0:_LANES])
        # the LLVM intrinsic takes its products' operands as 64 bytes (LLVM 20 and later)
        C[T.ramp(_0, 1, LANES)] = T.call_llvm_pure_intrin(
            "int32x16", "llvm.x86.avx512.vpdpbusd.512", C[T.ramp(_0, 1, LANES)],
            T.reinterpret("int8x64", T.broadcast(
                T.reinterpret("int32", A.vload([_0], "uint8x4")), LANES)),
            B.vload([_0, _0], "int8x64"))


#: The intrinsic's name for ``Schedule.tensorize``.
INTRIN = "tvmfuse.avx512_vpdpbusd_16x4"
TensorIntrin.register(INTRIN, description(INPUTS, ACCUMULATOR, LANES, GROUP), _impl,
                      override=True)


def available(vector) -> bool:
    """Whether the target's core (a :class:`tvmfuse.targets.Vector`) has the instruction."""
    return vector.dot_int8


def link(sch, loop) -> None:
    """Nothing to link: the LLVM intrinsic is called directly."""
