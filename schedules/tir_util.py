"""TensorIR analysis helpers that the CPU and CUDA schedules share: a kernel's blocks and loops,
its static extents and the index expressions its blocks read. Nothing here is target-specific."""

from __future__ import annotations

from tvm import s_tir, tirx


def root_blocks(sch: s_tir.Schedule) -> list:
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def is_reduction(sch: s_tir.Schedule, block) -> bool:
    return any(iv.iter_type != tirx.IterVar.DataPar for iv in sch.get(block).iter_vars)


def static_int(expr) -> int | None:
    """``expr`` as an int when it is a known integer, else None (a symbolic extent)."""
    return int(expr) if isinstance(expr, tirx.IntImm) else None


def static_extent(sch: s_tir.Schedule, loop) -> int | None:
    return static_int(sch.get(loop).extent)


def uses(expr, var: tirx.Var) -> bool:
    """The index expression ``expr`` reads the variable ``var``."""
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def read_index_nodes(block):
    """Every node of the index expressions ``block`` reads at (sums, products and divisions of
    its iterators), each expression's subterms included."""
    pending = [index.min for region in block.reads for index in region.region]
    while pending:
        node = pending.pop()
        yield node
        pending.extend(operand for operand in (getattr(node, "a", None), getattr(node, "b", None))
                       if operand is not None)


def lanes_for(extent: int | None, max_lanes: int) -> int:
    """The widest power-of-two vector (at most ``max_lanes``) that divides ``extent``."""
    if extent is None:
        return 1
    lanes = max_lanes
    while lanes > 1 and extent % lanes:
        lanes //= 2
    return lanes


def loops_match_iters(sch: s_tir.Schedule, block) -> bool:
    """True when each of the block's loops binds exactly one block iterator, in order (the form
    LegalizeOps produces, which the rules rely on to tell spatial from reduction loops)."""
    loops = sch.get_loops(block)
    if not loops or len(loops) != len(sch.get(block).iter_vars):
        return False
    realize = sch.get(loops[-1]).body
    if not isinstance(realize, s_tir.stmt.SBlockRealize):
        return False
    return all(isinstance(value, tirx.Var) and value.same_as(sch.get(loop).loop_var)
               for value, loop in zip(realize.iter_values, loops))


def inline_into_consumers(sch: s_tir.Schedule, blocks: list) -> list:
    """Inline every block of ``blocks`` that can be; return the ones that could not (outputs)."""
    kept = []
    for block in blocks:
        try:
            sch.compute_inline(block)
        except s_tir.ScheduleError:
            kept.append(block)
    return kept
