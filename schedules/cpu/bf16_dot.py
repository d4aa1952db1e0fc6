"""The bfloat16 pair dot product of AVX-512 BF16 (``vdpbf16ps``) as a TensorIR intrinsic.

One instruction takes sixteen float32 accumulators, one pair of bf16 inputs (broadcast to all
sixteen lanes) and sixteen pairs of bf16 weights, and adds to each accumulator the two products
of its pair: 32 multiply-adds where a float32 FMA does 16. The register-blocked GEMMs and convs
of a bf16 build (:func:`tvmfuse.schedules.cpu._blocked.block_anchor`) tensorize their innermost
``16 lanes x 2 reduction steps`` with it, reading weights packed as ``[.., k // 2, 16, k % 2]``.

TVM's LLVM code generator has no ``bfloat`` vector type (it stores bf16 as 16-bit integers and
computes in float32: ``BF16ComputeLegalize``, which also turns a kernel's own bf16 buffers into
float32 ones unless their address is taken), so the instruction's LLVM intrinsic, which takes
``<32 x bfloat>``, is called through a small function written in LLVM IR that takes the pairs as
int32 lanes: the kernel loads the input pair (broadcast) and the weights' pairs itself, so the
loads keep TVM's alias information and the accumulators stay in registers across the reduction
(loaded inside the function through pointers, they were stored back every step). :data:`IMPORT`
links the function into the kernel's module and LLVM inlines it (``pragma_import_llvm`` marks
imported functions always-inline), leaving one ``vdpbf16ps`` a call.
"""

from __future__ import annotations

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ._dot import description

#: Float32 lanes of one accumulator vector, and bf16 products each lane sums per step (a pair).
LANES, GROUP = 16, 2
#: The input's and the weight's element types, and the accumulators'.
INPUTS, ACCUMULATOR = ("bfloat16", "bfloat16"), "float32"
# the same as the int64 indices of Relax's kernels, which tensorize matches exactly
_0, _LANES, _PAIR = (T.int64(n) for n in (0, LANES, GROUP))

#: The function a tensorized kernel calls: one ``vdpbf16ps`` (``acc``, the input pair broadcast
#: as int32 lanes, the weights' sixteen pairs as int32 lanes), written in :data:`LLVM_IR`.
FUNCTION = "tvmfuse_dpbf16ps"

#: The loop annotation that links :data:`LLVM_IR` into a kernel calling :data:`FUNCTION`.
IMPORT = "pragma_import_llvm"

LLVM_IR = f"""
define <16 x float> @{FUNCTION}(<16 x float> %acc, <16 x i32> %a, <16 x i32> %b) {{
  %a.bf16 = bitcast <16 x i32> %a to <32 x bfloat>
  %b.bf16 = bitcast <16 x i32> %b to <32 x bfloat>
  %sum = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %acc,
                                                             <32 x bfloat> %a.bf16,
                                                             <32 x bfloat> %b.bf16)
  ret <16 x float> %sum
}}
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
"""


@T.prim_func(s_tir=True)
def _impl(A: T.Buffer((_PAIR,), "bfloat16", offset_factor=1),
          B: T.Buffer((_LANES, _PAIR), "bfloat16", offset_factor=1),
          C: T.Buffer((_LANES,), "float32", offset_factor=1, scope="local")) -> None:
    with T.sblock("root"):
        T.reads(C[_0:_LANES], A[_0:_PAIR], B[_0:_LANES, _0:_PAIR])
        T.writes(C[_0:_LANES])
        # the addresses of A and B, taken and unused, keep a kernel's own bf16 buffers bf16
        T.evaluate(T.tvm_access_ptr(T.type_annotation("uint16"), A.data, A.elem_offset, _PAIR, 1))
        T.evaluate(T.tvm_access_ptr(T.type_annotation("uint16"), B.data, B.elem_offset,
                                    _LANES * _PAIR, 1))
        C[T.ramp(_0, 1, LANES)] = T.call_extern(
            "float32x16", FUNCTION, C[T.ramp(_0, 1, LANES)],
            T.broadcast(T.reinterpret("int32", A.vload([_0], "bfloat16x2")), LANES),
            T.reinterpret("int32x16", B.vload([_0, _0], "bfloat16x32")))


#: The intrinsic's name for ``Schedule.tensorize``.
INTRIN = "tvmfuse.avx512_dpbf16ps_16x2"
TensorIntrin.register(INTRIN, description(INPUTS, ACCUMULATOR, LANES, GROUP), _impl,
                      override=True)


def available(vector) -> bool:
    """Whether the target's core (a :class:`tvmfuse.targets.Vector`) has the instruction."""
    return vector.dot_bf16


def link(sch, loop) -> None:
    """Annotate ``loop`` (one enclosing every tensorized call) to link the function they call."""
    sch.annotate(loop, IMPORT, LLVM_IR)
