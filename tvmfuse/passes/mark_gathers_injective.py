"""MarkGathersInjective: gathers (``take``, ``index_tensor``) tagged injective, so FuseOps fuses them.

``AnnotateTIROpPattern`` tags a kernel opaque when one buffer's index is read from another buffer
(``T_take[i, j] = A[ids[i], j]``): an embedding lookup, or BERT's padding-mask gather. FuseOps then
leaves each gather as a kernel of its own, between the cast of its indices and the add that uses
its rows (BERT-base: 5 kernels for the word embedding and the mask where 2 do). A gather is
injective in the sense FuseOps needs: every output element is computed on its own from its own
inputs, so it can be inlined into its consumer and take its producers.

A kernel is retagged when each of its blocks is spatial (no reduction) and writes one buffer at
exactly its iteration variables (``index_tensor`` broadcasts its indices in blocks of their own
first); anything else keeps its tag.

Preconditions: after AnnotateTIROpPattern, before FuseOps.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

#: ``op_pattern`` values of TVM's OpPatternKind.
INJECTIVE, OPAQUE = 2, 8


@tvm.transform.module_pass(opt_level=0, name="MarkGathersInjective")
class MarkGathersInjective:
    """Retag opaque single-block gathers as injective; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updated = mod.clone()
        for gvar, func in mod.functions.items():
            if (isinstance(func, tirx.PrimFunc) and func.attrs is not None
                    and int(func.attrs.get("op_pattern", -1)) == OPAQUE and _is_gather(func)):
                updated[gvar] = func.with_attr("op_pattern", INJECTIVE)
        return updated


def _is_gather(func: tirx.PrimFunc) -> bool:
    """Every block of ``func`` is spatial and writes one element at its iteration variables."""
    try:
        sch = s_tir.Schedule(func)
        children = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # noqa: BLE001 - no root block: not a kernel of LegalizeOps' form
        return False
    return bool(children) and all(_writes_its_own_element(sch.get(c)) for c in children)


def _writes_its_own_element(block) -> bool:
    if block.init is not None or len(block.writes) != 1:
        return False
    if any(iv.iter_type != tirx.IterVar.DataPar for iv in block.iter_vars):
        return False
    store = block.body
    if not isinstance(store, tirx.BufferStore):
        return False
    iters = [iv.var for iv in block.iter_vars]
    return (len(store.indices) == len(iters)
            and all(index.same_as(var) for index, var in zip(store.indices, iters)))
