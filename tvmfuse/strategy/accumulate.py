"""Low-precision matmuls and convs that accumulate in float32: float16 operands and output,
float32 sums.

TVM's ToMixedPrecision(out_dtype="float16") writes ``matmul(a, b, out_dtype="float16")``, which
TVM legalizes as a float16 sum: a 768-long dot product rounded at every step (BERT-base fp16 ran
at a relative error of 3.0e-3 against PyTorch fp16's 1.1e-3). Its ``out_dtype="float32"`` form
sums in float32 but puts an ``astype`` between each matmul and its epilogue, which the fusion
patterns do not see through. So the graph keeps float16 ``out_dtype``s and the legalization
widens them: each such matmul or conv becomes the op with a float32 ``out_dtype`` (TVM computes
``sum(float32(a) * float32(b))``: the form the tensor-core intrinsics with float32 accumulators
match) followed by a cast to the op's own dtype, both in the kernel the op belongs to, so the
epilogue fused after it stays where it was.

The accumulator is a parameter (a bfloat16 build accumulates in float32 the same way).
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax, topi

from ..passes._rewrite import NARROW_FLOATS, WITH_OUT_DTYPE


def legalizations(overrides: dict, accumulator: str = "float32") -> dict:
    """Legalizations of the low-precision matmuls and convs that sum in ``accumulator``, each
    over the legalization it replaces: ``overrides``' for that op where it has one (a target's
    own), else TVM's."""
    widened = {}
    for name, rewrite in WITH_OUT_DTYPE.items():
        inner = overrides.get(name) or tvm.ir.Op.get(name).get_attr("FLegalize")
        widened[name] = _widened(inner, rewrite, accumulator)
    return widened


def _widened(inner: Callable, rewrite: Callable, accumulator: str) -> Callable:
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        dtype = call.ty.dtype
        if dtype not in NARROW_FLOATS:
            return inner(bb, call)
        wide = bb.emit(inner(bb, bb.normalize(rewrite(call, accumulator))))
        return bb.call_te(topi.cast, wide, dtype, primfunc_name_hint="round_sum")

    return legalize
