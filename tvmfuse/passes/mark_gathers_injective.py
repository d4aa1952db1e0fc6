"""MarkGathersInjective: gathers (``take``, ``index_tensor``) tagged injective, so FuseOps fuses
them.

``AnnotateTIROpPattern`` tags a kernel opaque when one buffer's index is read from another buffer
(``T_take[i, j] = A[ids[i], j]``): an embedding lookup, or BERT's padding-mask gather. FuseOps then
leaves each gather as a kernel of its own, between the cast of its indices and the add that uses
its rows (BERT-base: 5 kernels for the word embedding and the mask where 2 do). A gather is
injective in the sense FuseOps needs: every output element is computed on its own from its own
inputs, so it can be inlined into its consumer and take its producers.

A kernel is retagged when each of its blocks is spatial (no reduction) and writes one buffer at
exactly its iteration variables (``index_tensor`` broadcasts its indices in blocks of their own
first), and one of them reads at an index loaded from a buffer; anything else keeps its tag (a
kernel tagged opaque on purpose, as WinogradConv2D's input transform, stays opaque).

Preconditions: after AnnotateTIROpPattern, before FuseOps.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.ir.expr import Expr, TensorLoad

from ..names import INJECTIVE, OP_PATTERN, OPAQUE


@tvm.transform.module_pass(opt_level=0, name="MarkGathersInjective")
class MarkGathersInjective:
    """Retag opaque single-block gathers as injective; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updated = mod.clone()
        for gvar, func in mod.functions.items():
            if (isinstance(func, tirx.PrimFunc) and func.attrs is not None
                    and int(func.attrs.get(OP_PATTERN, -1)) == OPAQUE and _is_gather(func)):
                updated[gvar] = func.with_attr(OP_PATTERN, INJECTIVE)
        return updated


def _is_gather(func: tirx.PrimFunc) -> bool:
    """Every block of ``func`` is spatial and writes one element at its iteration variables."""
    try:
        sch = s_tir.Schedule(func)
        children = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # noqa: BLE001 - no root block: not a kernel of LegalizeOps' form
        return False
    blocks = [sch.get(c) for c in children]
    return (bool(blocks) and all(_writes_its_own_element(b) for b in blocks)
            and any(_reads_indirectly(b.body.value) for b in blocks))


def _reads_indirectly(expr) -> bool:
    """``expr`` loads from a buffer at an index that is itself loaded from a buffer."""
    return any(_buffer_loads(index) for load in _buffer_loads(expr) for index in load.indices)


def _buffer_loads(expr) -> list:
    """Every buffer load in ``expr`` (0.27 has no Python visitor for TIR expressions, and its
    loads are ``tvm.ir.expr.TensorLoad``: ``tirx.BufferLoad`` is a constructor function)."""
    if isinstance(expr, TensorLoad):
        return [expr, *(load for index in expr.indices for load in _buffer_loads(index))]
    children = [getattr(expr, field, None) for field in
                ("a", "b", "value", "condition", "true_value", "false_value")]
    children += list(getattr(expr, "args", None) or [])
    return [load for child in children if isinstance(child, Expr)
            for load in _buffer_loads(child)]
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
