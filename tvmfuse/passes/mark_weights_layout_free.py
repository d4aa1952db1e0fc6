"""MarkWeightsLayoutFree: a kernel's parameters that every call passes a constant (the weights)
are named in its ``layout_free_buffers`` attribute, so a schedule may choose their layout (see
PrepackWeights).

TVM's AttachAttrLayoutFreeBuffers does the same by adding a copy of each kernel under a new name
(``fused_conv2d_add_relu1`` becomes ``fused_conv2d_add_relu11``), which would rename the kernels
the build report, the profile and the tuning records name. This pass sets the attribute on the
kernel itself; a kernel called with a constant at one call and a variable at another gets only
the parameters that are constant at every call.

Preconditions: after FuseTIR.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from ..names import LAYOUT_FREE_BUFFERS
from ._rewrite import constant_arguments


@tvm.transform.module_pass(opt_level=0, name="MarkWeightsLayoutFree")
class MarkWeightsLayoutFree:
    """Attach ``layout_free_buffers`` to every kernel called with constants; see the docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        constant = constant_arguments(mod)
        updated = mod.clone()
        for gvar, func in mod.functions.items():
            indices = sorted(constant.get(gvar.name_hint, ()))
            if isinstance(func, tirx.PrimFunc) and indices:
                updated[gvar] = func.with_attr(LAYOUT_FREE_BUFFERS, indices)
        return updated
