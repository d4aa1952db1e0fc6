"""``cp.async`` copies whose global addresses are 64-bit sums, so that the compiler keeps one base
pointer a pipeline step and folds each copy's constant offset into the instruction.

TVM's ``InjectPTXAsyncCopy`` (the pass behind ``"tirx.use_async_copy"``) calls a helper
``(void* src, int src_off)`` with the flat element offset of the copy computed in 32-bit ``int``
arithmetic. ``src + src_off * 2`` then sign-extends a fresh 32-bit sum for every copy: in the PTX
of the 128 x 128 GEMM tile (schedules/cuda/matmul.py) each of a step's 16 ``cp.async`` costs an
``add.s32``, a ``cvt.s64.s32`` and an ``add.s64``, and the warps stall on that integer math
(Nsight Compute's stall reasons for ``python3 benchmarks/cuda_gemm.py --shapes 4096,4096,4096``).

:func:`cp_async` replaces TVM's code generator for that call (its ``register_codegen`` registry
is the extension point): the same ``cp.async.{ca,cg}.shared.global`` with the optional zero-fill
predicate, but the source offset is rebuilt as a 64-bit sum of 64-bit terms (:func:`widen`), and
the helper takes ``long long``. The offsets' values are unchanged (every term is computed as
before, then widened), so a copy reads the same bytes; what changes is that the sum is
reassociable: loop-invariant terms are hoisted and the unrolled copies' constant strides become
immediates.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.backend.cuda.codegen.registry import CODEGEN_REGISTRY, register_codegen
from tvm.backend.cuda.op import cuda_func_call

#: The op TVM's pass emits, as the codegen registry names it.
OP = "s_tir_cp_async_raw"
#: TVM's own generator, kept for any call shape this module does not handle.
_STOCK = CODEGEN_REGISTRY.get("tirx." + OP)

#: The zero fill of a predicated copy's destination, by copy size.
_ZERO_FILL = {
    4: "@!p st.shared.u32 [%0], {%4};",
    8: "@!p st.shared.v2.u32 [%0], {%4, %4};",
    16: "@!p st.shared.v4.u32 [%0], {%4, %4, %4, %4};",
}


def widen(expr: tirx.PrimExpr) -> tirx.PrimExpr:
    """``expr``, an int32 index, as an int64 sum: additions, subtractions and multiplications by
    constants are rebuilt in int64 over their widened operands, anything else (a variable, a
    shift, a division) is computed as before and then cast. Equal in value to ``expr`` wherever
    ``expr`` does not overflow (where it would, the int32 form was already wrong)."""
    if str(expr.ty) == "int64":
        return expr
    if isinstance(expr, tirx.IntImm):
        return tirx.IntImm("int64", expr.value)
    if isinstance(expr, (tirx.Add, tirx.Sub)):
        return type(expr)(widen(expr.a), widen(expr.b))
    if isinstance(expr, tirx.Mul) and isinstance(expr.b, tirx.IntImm):
        return tirx.Mul(widen(expr.a), widen(expr.b))
    if isinstance(expr, tirx.Mul) and isinstance(expr.a, tirx.IntImm):
        return tirx.Mul(widen(expr.a), widen(expr.b))
    return tirx.Cast("int64", expr)


def _element_bytes(pointer) -> int:
    """Bytes of the element type a pointer argument points to (1 for a byte buffer)."""
    element = getattr(getattr(pointer, "ty", None), "element_type", None)
    if element is None or not hasattr(element, "dtype"):
        return 1
    bits = tvm.runtime.DataType(str(element.dtype)).bits
    return max(bits // 8, 1)


def _helper(size: int, dst_bytes: int, src_bytes: int, predicated: bool) -> tuple[str, str]:
    """The helper's name and source: ``dst``'s offset in int (shared memory is < 4 GB), ``src``'s
    in long long."""
    variant = "cg" if size == 16 else "ca"
    name = (f"tvmfuse_cp_async{'_pred' if predicated else ''}_{variant}_{size}_{dst_bytes}"
            f"_{src_bytes}")
    head = (f"__forceinline__ __device__ void {name}(void* dst, int dst_off, void* src, "
            f"long long src_off{', int predicate' if predicated else ''}) {{\n"
            f"  uint8_t* dst_p = (uint8_t*)dst + dst_off * {dst_bytes};\n"
            f"  uint8_t* src_p = (uint8_t*)src + src_off * {src_bytes};\n"
            "  unsigned int dst_addr = __cvta_generic_to_shared(dst_p);\n")
    if predicated:
        body = ('  asm volatile("{ .reg .pred p; setp.eq.u32 p, %3, 1; "\n'
                f'    "@p cp.async.{variant}.shared.global [%0], [%1], %2; "\n'
                f'    "{_ZERO_FILL[size]} }}"\n'
                f'    :: "r"(dst_addr), "l"(src_p), "n"({size}), "r"(predicate), "r"(0));\n')
    else:
        body = (f'  asm volatile("cp.async.{variant}.shared.global [%0], [%1], %2;"\n'
                f'    :: "r"(dst_addr), "l"(src_p), "n"({size}));\n')
    return name, "\n" + head + body + "}\n"


@register_codegen(OP)
def cp_async(*args):
    """The code of one ``(dst, dst_off, src, src_off, size[, predicate])`` copy."""
    if len(args) not in (5, 6) or (len(args) == 6 and int(args[4]) not in _ZERO_FILL):
        return _STOCK(list(args))
    dst, dst_off, src, src_off, size = args[:5]
    predicate = args[5] if len(args) == 6 else None
    if isinstance(predicate, tirx.IntImm) and predicate.value == -1:
        predicate = None
    name, source = _helper(int(size), _element_bytes(dst), _element_bytes(src),
                           predicate is not None)
    operands = (dst, dst_off, src, widen(src_off)) + ((predicate,) if predicate is not None else ())
    return cuda_func_call(name, *operands, source_code=source)
