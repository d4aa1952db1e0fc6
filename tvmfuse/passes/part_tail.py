"""PartTail: a loop annotated ``PART_TAIL`` (valued ``n``) becomes two loops of its kind, its
iterations before ``n`` and those from ``n`` on, each with its own copy of the body (the second
serial where it is a single iteration).

A register-blocked CPU kernel whose output has fewer columns than its tiles compute (columns
padded to whole tiles, or a depthwise conv's padded channels sliced in its epilogue: 197 of 208)
writes each tile's output under a predicate on the column. In one loop over every tile nothing
proves that predicate true in any of them, and TVM's vectorizer, which masks a store only where
its address moves with the predicate, writes every tile's output one element at a time behind a
branch. In a loop over the whole column tiles alone the predicate is provably true and simplified
away; only the last column tile's loop keeps it. Where one column tile spans the output (77
columns in a tile of 80), the annotated loop is the tile's vectors in its epilogue: the whole
vectors are stored apart from the last, masked one. A 3x3 depthwise conv over 197 channels of
28x28 runs twice as fast so, and the GEMM 197 x 768 x 77 a tenth faster
(``benchmarks/kernel_bench.py dense --sizes 77``).

The schedule cannot split the loop itself (``Schedule.loop_partition`` of a loop holding a block
that ``reverse_compute_at`` moved there crashes TVM 0.27), and TVM's own LoopPartition leaves a
parallel loop whole, hints or not. So the schedule annotates the loop, and :func:`lowering` lowers
such kernels' blocks first (each loop then allocates its own tile buffers), splits the loop, and
runs TVM's default lowering on the result.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ..names import PART_TAIL


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="PartTail")
def PartTail(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 - a TVM pass
    """Split every loop annotated ``PART_TAIL`` (its blocks already lowered); see the module
    docstring."""
    return func.with_body(_split(func.body))


def lowering(default: tvm.transform.Pass) -> tvm.transform.Pass:
    """TVM's ``default`` TIR lowering, the kernels with an annotated tile loop first lowered to
    plain loops and split by :class:`PartTail`."""
    early = tvm.transform.Sequential([
        *lower_blocks(),
        PartTail,
        tirx.transform.ConvertSSA(),  # the second loop's variables and buffers made its own
    ])

    @tvm.transform.module_pass(opt_level=0, name="PartTailLowering")
    def lower(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        def marked(func: tirx.PrimFunc) -> bool:
            return _annotated(func.body)

        split = tirx.transform.Filter(marked)(mod)
        if not split.functions:
            return default(mod)
        rest = tirx.transform.Filter(lambda func: not marked(func))(mod)
        rest.update(early(split))
        return default(rest)

    return lower


def lower_blocks() -> list[tvm.transform.Pass]:
    """The first passes of TVM's s_tir lowering, to plain loops (each tile loop's buffers then
    allocated inside it): what :class:`PartTail` runs after."""
    return [
        s_tir.transform.CanonicalizeLoop(),
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.LowerOpaqueBlock(),
    ]


def _annotated(stmt) -> bool:
    """Whether a loop among ``stmt``'s loops, sequences and blocks is annotated ``PART_TAIL``."""
    if isinstance(stmt, tirx.For):
        return PART_TAIL in stmt.annotations or _annotated(stmt.body)
    if isinstance(stmt, tirx.SeqStmt):
        return any(_annotated(s) for s in stmt.seq)
    if isinstance(stmt, s_tir.SBlockRealize):
        return _annotated(stmt.block.body)
    return False


def _split(stmt):
    """``stmt`` with its annotated loops (among its loops, sequences and attributes) split."""
    if isinstance(stmt, tirx.SeqStmt):
        parts = [_split(s) for s in stmt.seq]
        if all(p.same_as(s) for p, s in zip(parts, stmt.seq)):
            return stmt
        return tirx.SeqStmt([q for p in parts for q in (p.seq if isinstance(p, tirx.SeqStmt)
                                                          else [p])])
    if isinstance(stmt, tirx.AttrStmt):
        body = _split(stmt.body)
        return stmt if body.same_as(stmt.body) else tirx.AttrStmt(
            stmt.node, stmt.attr_key, stmt.value, body)
    if not isinstance(stmt, tirx.For):
        return stmt
    if PART_TAIL not in stmt.annotations:
        body = _split(stmt.body)
        return stmt if body.same_as(stmt.body) else tirx.For(
            stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
            stmt.annotations)
    whole = int(stmt.annotations[PART_TAIL])
    annotations = {k: v for k, v in stmt.annotations.items() if k != PART_TAIL}
    # both loops keep the loop variable and the body's buffers here; ConvertSSA renames the
    # second loop's
    head = tirx.For(stmt.loop_var, stmt.min, whole, stmt.kind, stmt.body,
                    stmt.thread_binding, annotations)
    # a parallel loop of one iteration (a row reduction's last group of rows) would start the
    # thread pool for one thread's work (0.7-2 us)
    one = isinstance(stmt.extent, tirx.IntImm) and int(stmt.extent) - whole == 1
    kind = tirx.ForKind.SERIAL if one else stmt.kind
    tail = tirx.For(stmt.loop_var, stmt.min + whole, stmt.extent - whole, kind,
                    stmt.body, stmt.thread_binding, annotations)
    return tirx.SeqStmt([head, tail])
