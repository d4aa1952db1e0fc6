"""UseWgmmaGemms: fused fp16 and bf16 GEMMs over constant weights become Hopper wgmma kernels
(``schedules/cuda/wgmma.py``), their weights transposed to [N, K] at build time.

A kernel is taken when :func:`schedules.cuda.gemm_match.match_gemm` reads it as
``epilogue(A @ B)`` (or :func:`~schedules.cuda.conv_match.match_conv` as a conv with a window or
strides, which the kernel computes as an implicit GEMM over its NHWC input and OHWI weight) with
at least ``min_rows`` rows (below that mma.sync's smaller tiles fill the GPU better: the wgmma
kernel's blocks are 128 rows), K of at least ``min_k`` (one pipeline step of 64 is too short for
the wgmma pipeline to pay for its start; from two steps on, on the two-block tiles of
:func:`~schedules.cuda.wgmma_tile.choose_wgmma_tile`, wgmma is ahead of mma.sync: ResNet-50's
1x1 convs at batch 32, ``python3 benchmarks/cuda_conv.py --engines mma,wgmma``), or of at least
``shallow_k`` where the GEMM has ``shallow_rows`` rows or more (enough 128-row blocks to fill
the SMs many times over: ResNet-50's 56x56 convs over 64 channels at batch 32, 100352 rows, are
faster on wgmma as a whole model, at batch 1, 3136 rows, they are not; ``python -m tvmfuse bench
resnet50 --target cuda-sm90 --dtype fp16 --batch 32`` measures it)
and every call passes B as a Relax constant (wgmma reads both operands K-major; a legalized
linear layer's weight is [K, N], so each call's constant is transposed here once). The kernel
replaces the PrimFunc under the same name, marked scheduled, written in TIRx (lowered by TIRx's
pipeline, see :func:`tvmfuse.pipeline.build`) and bound to ``sm_90a``, the architecture wgmma
needs.

With ``mma`` (rule ``mma_gemm``), a fused GEMM (not a conv with a window) over a constant
weight that the wgmma kernel does not take becomes the hand-written mma.sync kernel
(``schedules/cuda/mma_gemm.py``, the same epilogue, its weight transposed the same way) where
:func:`~schedules.cuda.mma_gemm.choose_tile` gives it a tile (blocks of 64 x 64 or more: BERT's
batch-1 QKV and FFN1, ViT's FFN1); the rest are left to the schedule rules.

A GEMM whose output rows are normalized in the same kernel (``layer_norm(x @ W + b +
residual)``, rule ``layer_norm_epilogue``; :func:`~schedules.cuda.row_norm.match_gemm_row_norm`)
becomes the wgmma kernel with the normalization in its epilogue, a row's column tiles one
cluster's blocks (at most the target's ``GpuFacts.max_cluster_size``): taken as other GEMMs are
(rows, K), and where N is a multiple of 8. :meth:`UseWgmmaGemms.takes_row_norm` is the same
test on the shapes alone, which the fusion rule asks before it groups the ops (a group this pass
left would go to a generic schedule).

Preconditions: after FuseTIR, before the schedule rules (which skip what it marked scheduled).

Dependencies point one way: this pass imports ``schedules/cuda`` (the matchers, the tile choice
and the kernels it substitutes); the schedules import no pass.
"""

from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax

from ..names import IS_SCHEDULED, SCHEDULE, TIRX_KERNEL
from ..schedules.cuda import conv_match, gemm_match, mma_gemm, row_norm, wgmma, wgmma_tile
from ..targets import SM90_GPU, GpuFacts
from ._rewrite import constant_arguments

log = logging.getLogger(__name__)


@tvm.transform.module_pass(opt_level=0, name="UseWgmmaGemms")
class UseWgmmaGemms:
    """Replace each fused GEMM the wgmma kernel takes; see the module docstring."""

    def __init__(self, target: tvm.target.Target, min_rows: int = 1024, min_k: int = 128,
                 shallow_k: int = 64, shallow_rows: int = 16384, wgmma: bool = True,
                 mma: bool = False, gpu: GpuFacts = SM90_GPU):
        self.target, self.gpu = target, gpu
        self.min_rows = min_rows
        self.min_k = min_k
        self.shallow_k, self.shallow_rows = shallow_k, shallow_rows
        self.wgmma, self.mma = wgmma, mma

    def takes(self, found: gemm_match.GemmMatch) -> bool:
        """Whether the wgmma kernel takes the GEMM ``found`` (rows and K, see above; N for a
        normalized one, :meth:`takes_row_norm`)."""
        if found.row_norm is not None:
            return self.wgmma and self.takes_row_norm(found.m, found.n, found.k)
        return self._deep_enough(found.m, found.k)

    def _deep_enough(self, m: int, k: int) -> bool:
        deep = k >= self.min_k or (k >= self.shallow_k and m >= self.shallow_rows)
        return m >= self.min_rows and deep

    def takes_row_norm(self, m: int, n: int, k: int) -> bool:
        """Whether an ``m x n`` GEMM over ``k`` with its rows normalized in the epilogue is
        taken: as another GEMM, with N a multiple of 8 in at most a cluster of column tiles."""
        if not self._deep_enough(m, k) or n % 8:
            return False
        tile = wgmma_tile.choose_wgmma_tile(m, n, self.gpu,
                                            k_steps=-(-k // wgmma_tile.BLOCK_K))
        return -(-n // tile.block_n) <= self.gpu.max_cluster_size

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        matches = {}  # GlobalVar -> (match, the mma kernel's tile or None for wgmma)
        for gvar, func in mod.functions.items():
            if isinstance(func, tvm.tirx.PrimFunc) and not func.attrs.get(IS_SCHEDULED, False):
                found = _match(func)
                if found is None:
                    continue
                if found.row_norm is not None:
                    if self.takes(found):
                        matches[gvar] = (found, None)
                    else:  # (the fusion rule asked takes_row_norm: a model's shapes agree)
                        log.warning("%s: a GEMM + row normalization (%dx%dx%d) the wgmma kernel "
                                    "does not take: left to the generic schedule",
                                    gvar.name_hint, found.m, found.n, found.k)
                elif self.wgmma and self.takes(found):
                    matches[gvar] = (found, None)
                elif self.mma and found.conv is None:
                    tile = mma_gemm.choose_tile(found.m, found.n, found.k, self.gpu)
                    if tile is not None:
                        matches[gvar] = (found, tile)
        constant = constant_arguments(mod)
        matches = {gvar: match for gvar, match in matches.items()
                   if match[0].b_index in constant.get(gvar.name_hint, ())}
        if not matches:
            return mod
        # a PrimFunc's new signature (B is [N, K]) needs a new GlobalVar: the old one keeps the
        # type it was made with, which Relax checks the calls against
        updated = mod.clone()
        for gvar in matches:
            del updated[gvar]
        builder = relax.BlockBuilder(updated)
        renamed = {}
        for gvar, (found, tile) in matches.items():
            kernel = (found.kernel(gpu=self.gpu) if tile is None
                      else found.kernel(tile, mma_gemm.gemm_kernel, self.gpu))
            name = wgmma.NAME if tile is None else mma_gemm.NAME
            kernel = kernel.with_attrs({
                IS_SCHEDULED: True, SCHEDULE: name, TIRX_KERNEL: True,
                "target": self.target, "global_symbol": gvar.name_hint})
            renamed[gvar] = (builder.add_func(kernel, gvar.name_hint),
                             found.b_index if found.b_kn else None)
            log.debug("%s: %s GEMM %dx%dx%d", gvar.name_hint, name, found.m, found.n, found.k)
        return _redirect_calls(builder.get(), renamed)


def _match(func: tvm.tirx.PrimFunc) -> gemm_match.GemmMatch | None:
    for match in (gemm_match.match_gemm, conv_match.match_conv, row_norm.match_gemm_row_norm):
        for dtype in ("float16", "bfloat16"):
            found = match(func, dtype)
            if found is not None:
                return found
    return None


def _one_element(builder: relax.BlockBuilder, arg: relax.Expr) -> relax.Expr:
    """``arg`` reshaped to one element where it is 0-d (a constant rewritten, another value
    reshaped), otherwise itself."""
    if arg.ty.ndim != 0:
        return arg
    if isinstance(arg, tvm.ir.expr.Constant):
        value = arg.value.numpy()
        return relax.const(value.reshape(1), str(value.dtype))
    return builder.emit(relax.op.reshape(arg, [1]))


def _redirect_calls(mod: tvm.IRModule, renamed: dict) -> tvm.IRModule:
    """Calls of each kernel in ``renamed`` (old GlobalVar -> new one and the index of a B to
    transpose, or None) call the new one, with their constant B ([K, N]) transposed and their
    0-d arguments as one element (the kernels declare them so: ``gemm_match.GemmMatch.kernel``)."""

    @relax.expr_functor.mutator
    class Redirect(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            callee = call.args[0] if call.args else None
            if not isinstance(callee, tvm.ir.GlobalVar) or callee not in renamed:
                return call
            gvar, index = renamed[callee]
            args = list(call.args[1].fields)
            if index is not None:
                weight = args[index].value.numpy()
                args[index] = relax.const(np.ascontiguousarray(weight.T), str(weight.dtype))
            args = [_one_element(self.builder_, arg) for arg in args]
            fields = self.builder_.normalize(relax.Tuple(args))
            return relax.Call(call.op, [gvar, fields, *call.args[2:]], call.attrs,
                              call.ty_args)

    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gvar] = Redirect(mod).visit_expr(func)
    return mod
