"""GroupNormAsLayerNorm: a GroupNorm over ``[N, C, W]`` is a LayerNorm over each group's
contiguous ``C / G * W`` elements, then the per-channel scale and shift.

Wav2Vec2's feature encoder normalizes its first conv's 512 channels, each its own group, over
3199 frames. TVM legalizes ``group_norm`` as a reduction over two axes of a 4-D reshape, which
no CPU rule takes: TVM's default schedule ran it at 41 GFLOP/s, 3.6 ms
(``tvmfuse inspect wav2vec2 --profile``). Written as ``layer_norm`` over the rows of
``[N, G, C / G * W]`` (without its own scale and shift: ones and zeros) followed by the channels'
``gamma`` and ``beta``, it is a row reduction with an elementwise epilogue: the kernels and
rules LayerNorm already takes. The arithmetic is the same (mean, variance, epsilon).

Preconditions: imported Relax with static shapes, before the fusion patterns. Only 3-D
channels-first inputs (``channel_axis=1``, ``axes=[2]``) are rewritten; a 4-D GroupNorm is left to
the layout passes.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ._rewrite import dtype_of, rewrite_functions, static_shape


@tvm.transform.module_pass(opt_level=0, name="GroupNormAsLayerNorm")
class GroupNormAsLayerNorm:
    """Rewrite channels-first 3-D GroupNorms as row LayerNorms; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        x, gamma, beta = wildcard(), wildcard(), wildcard()
        pattern = is_op("relax.nn.group_norm")(x, gamma, beta)

        def rewrite(expr: relax.Expr, matches) -> relax.Expr:
            a = expr.attrs
            shape = static_shape(matches[x].ty.shape) if hasattr(matches[x].ty, "shape") else None
            dtype = dtype_of(matches[x])
            if (shape is None or len(shape) != 3 or int(a.channel_axis) != 1
                    or [int(i) for i in a.axes] != [2] or not a.center or not a.scale):
                return expr
            batch, channels, width = shape
            groups = int(a.num_groups)
            row = channels // groups * width
            rows = relax.op.reshape(matches[x], [batch, groups, row])
            normed = relax.op.nn.layer_norm(
                rows, relax.const(np.ones(row, dtype), dtype),
                relax.const(np.zeros(row, dtype), dtype), axes=[2], epsilon=float(a.epsilon))
            per_channel = [channels, 1]
            return relax.op.add(
                relax.op.multiply(relax.op.reshape(normed, shape),
                                  relax.op.reshape(matches[gamma], per_channel)),
                relax.op.reshape(matches[beta], per_channel))

        return rewrite_functions(mod, pattern, rewrite)
