"""SliceScatterAsConcat: ``slice_scatter(x, src, start, end, 1, axis)`` with constant bounds
becomes ``concat([x[..:start], src, x[end:..]], axis)``.

``ToMixedPrecision`` types every argument of a call it casts, and a slice_scatter's bounds are
integers, not tensors: it failed with "Expected TensorType, but got T.int64", so
fp16 and bf16 builds of every model that writes its rotary embedding into part of a head
(DeepSeek-V2/V3's and MiniCPM3's multi-head latent attention, GLM-4-MoE-Lite) stopped in the
first phase (``benchmarks/coverage.py --dtype fp16``). A concatenation of slices is what the
scatter computes, in ops the pass and the fusion rules know.

Preconditions: imported Relax with static shapes (others are left alone), before
ToMixedPrecision.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ..schedules.tir_util import static_int
from ._rewrite import rewrite_functions, static_shape


@tvm.transform.module_pass(opt_level=0, name="SliceScatterAsConcat")
class SliceScatterAsConcat:
    """Rewrite unit-step, constant-bound slice_scatters as concatenations; see the module
    docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        x, src = wildcard(), wildcard()
        pattern = is_op("relax.slice_scatter")(x, src, wildcard(), wildcard(), wildcard())

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            start, end, step = (static_int(arg) for arg in expr.args[2:])  # None: symbolic
            shape = static_shape(matches[x].ty.shape) if hasattr(matches[x].ty, "shape") else None
            if None in (start, end, step, shape) or step != 1:
                return expr
            axis = int(expr.attrs.axis) % len(shape)
            parts = []
            if start > 0:
                parts.append(relax.op.strided_slice(matches[x], [axis], [0], [start]))
            parts.append(matches[src])
            if end < shape[axis]:
                parts.append(relax.op.strided_slice(matches[x], [axis], [end], [shape[axis]]))
            return parts[0] if len(parts) == 1 else relax.op.concat(parts, axis=axis)

        return rewrite_functions(mod, pattern, rewrite)

