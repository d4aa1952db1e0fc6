"""PrepackWeights: the weight layouts the CPU schedules chose are computed once, at build time.

A conv or GEMM schedule reads its weight ``W[k..., n]`` in panels of its register tile's
columns: ``P[n // panel, k..., n % panel]`` (:func:`schedules.cpu._blocked.pack_panels`). It
writes that as a packing block inside the kernel, annotated the way MetaSchedule's RewriteLayout
annotates its own (so a searched record's layout works the same). TVM's
SplitLayoutRewritePreproc moves each such block out into a ``<kernel>_weight_prepack`` function
called on the weight; this pass compiles those functions as one module and runs them on the
constant weights, and the kernels are called ``<kernel>_prepacked`` on the packed constants.

This pass then gives every kernel its own name back (reports, profiles and tuning records name
kernels as FuseTIR did) and drops the packing functions, which nothing calls any more.

Packed, BERT-base's GEMMs alone run 1.2-1.5x as fast (128 x 768 x 3072 + bias + ReLU, 128 x
3072 x 768, 128 x 768 x 2304; ``tvmfuse inspect bert-base --profile``). Unpacked, the tile's
weights for one reduction step are 256 bytes every ``N`` floats (12 KB apart for N = 3072): a
new page each step.

Preconditions: after the schedule phase, on a module whose kernels' weights are Relax constants
(MarkWeightsLayoutFree marked them); a weight that is a function parameter is packed on
every run instead, as its own kernel.
"""

from __future__ import annotations

import tvm
from tvm import relax, s_tir, tirx

from ..names import LAYOUT_REWRITE_PREPROC, PREPACK
from ._rewrite import calls_op, mutate_functions
from .fold_constants_in_numpy import FoldRemainingConstants

#: Suffixes SplitLayoutRewritePreproc gives the two halves of a kernel.
PACKING, PACKED = "_weight_prepack", "_prepacked"


@tvm.transform.module_pass(opt_level=0, name="PrepackWeights")
class PrepackWeights:
    """Split out, evaluate and drop the weight packing blocks; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        # SplitLayoutRewritePreproc fails on a PrimFunc whose body is not a root block (a kernel
        # written scheduled, FuseAttention's): it sees only the kernels it splits
        packed = {gvar for gvar, func in mod.functions.items()
                  if isinstance(func, tvm.tirx.PrimFunc) and _has_packing(func)}
        if not packed:
            return mod
        others = {gvar: func for gvar, func in mod.functions.items()
                  if isinstance(func, tvm.tirx.PrimFunc) and gvar not in packed}
        split = tvm.IRModule({gvar: func for gvar, func in mod.functions.items()
                              if gvar not in others}, attrs=mod.attrs)
        split = relax.transform.SplitLayoutRewritePreproc()(split)
        for gvar, func in others.items():
            split[gvar] = func
        mod = FoldRemainingConstants()(_run_packing(split))  # what is left
        mod = relax.transform.DeadCodeElimination()(mod)
        return _restore_names(mod)


def _run_packing(mod: tvm.IRModule) -> tvm.IRModule:
    """Every packing function's calls on constant weights replaced by their results, the
    functions compiled together (FoldConstant compiles each alone, an LLVM module apiece)."""
    packing = {gvar: func.with_attr("global_symbol", gvar.name_hint)
               for gvar, func in mod.functions.items()
               if isinstance(func, tirx.PrimFunc) and gvar.name_hint.endswith(PACKING)}
    if not packing:
        return mod
    library = tvm.compile(tvm.IRModule(packing), target="llvm")
    return mutate_functions(mod, _Pack(mod, library))


@relax.expr_functor.mutator
class _Pack(relax.PyExprMutator):
    """``call_tir(<kernel>_weight_prepack, (constant,))`` -> the packed constant."""

    def __init__(self, mod: tvm.IRModule, library):
        super().__init__(mod)
        self.library = library

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (calls_op(call, "relax.call_tir") and call.args[0].name_hint.endswith(PACKING)
                and all(isinstance(a, tvm.ir.expr.Constant) for a in call.args[1].fields)):
            return call
        out = call.ty
        packed = tvm.runtime.empty([int(d) for d in out.shape.values], str(out.dtype))
        self.library[call.args[0].name_hint](*(a.value for a in call.args[1].fields), packed)
        return relax.const(packed)


def _has_packing(func: tvm.tirx.PrimFunc) -> bool:
    """A block of the kernel's root block is a packing block."""
    try:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # noqa: BLE001 - a kernel written without blocks packs nothing
        return False
    return any(LAYOUT_REWRITE_PREPROC in sch.get(block).annotations for block in blocks)


def _restore_names(mod: tvm.IRModule) -> tvm.IRModule:
    """``<kernel>_prepacked`` is called ``<kernel>`` again, where that name is free."""
    names = {gvar.name_hint for gvar in mod.get_global_vars()}
    builder = relax.BlockBuilder(mod)
    by_name = {}
    for gvar, func in mod.functions.items():
        name = gvar.name_hint[:-len(PACKED)]
        if gvar.name_hint.endswith(PACKED) and name not in names:
            by_name[gvar.name_hint] = builder.add_func(func.with_attr("global_symbol", name), name)
    if not by_name:
        return mod
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            builder.update_func(gvar, _Rename(by_name).visit_expr(func))
    return relax.transform.DeadCodeElimination()(builder.get())


@relax.expr_functor.mutator
class _Rename(relax.PyExprMutator):
    """Replaces the global variables named in ``by_name`` (the callee of a ``call_tir``)."""

    def __init__(self, by_name: dict[str, tvm.ir.GlobalVar]):
        super().__init__()
        self.by_name = by_name

    def visit_global_var_(self, op: tvm.ir.GlobalVar) -> relax.Expr:
        return self.by_name.get(op.name_hint, op)


def with_prepack_blocks(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its design-space packing blocks (annotated PREPACK) annotated for TVM's
    SplitLayoutRewritePreproc, as the build's packing blocks are; ``func`` itself when it has
    none."""
    try:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # noqa: BLE001 - a kernel written without blocks packs nothing
        return func
    renamed = False
    for block in blocks:
        if PREPACK in sch.get(block).annotations:
            sch.unannotate(block, PREPACK)
            sch.annotate(block, LAYOUT_REWRITE_PREPROC, True)
            renamed = True
    return sch.mod["main"] if renamed else func
