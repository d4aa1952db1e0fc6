"""TensorIR helpers shared by the CPU schedule rules: find a kernel's anchor, inline its epilogue,
parallelize and vectorize loop nests."""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl

from tvmfuse.targets import Vector

#: Below this many output elements a kernel runs on one thread: waking the pool costs more.
MIN_PARALLEL_ELEMENTS = 4096


class CpuRule(dl.ScheduleRule):
    """A hand-written CPU schedule rule: its ``name`` names it in the build report, and it blocks
    for ``vector``."""

    name: str

    def __init__(self, vector: Vector):
        self.vector = vector


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


def vectorize_inner(sch: s_tir.Schedule, loop, lanes: int):
    """Vectorize ``loop``: ``lanes`` wide where it divides the loop or the loop is at least two
    vectors long (the loop then partitioned into whole vectors and a tail in narrower vectors,
    :func:`tail_pieces`: TVM runs a vector loop whose last vector is predicated one lane at a
    time, and LoopPartition leaves int64 loops alone; 197 x 77 additions took 3.5 us so, 1.8
    partitioned with a scalar tail, Zen 4); else the widest power-of-two vector of at least 4
    that divides it. Returns the loop to fuse with the loops around it: the one outside the
    vector, ``loop`` itself where it is not vectorized, or None where it was partitioned."""
    extent = static_extent(sch, loop)
    if extent is not None and extent % lanes and extent >= 2 * lanes:
        pieces = tail_pieces(extent % lanes)
        whole, *tail = sch.loop_partition(loop, [extent // lanes * lanes, *pieces[:-1], None])
        _, lane = sch.split(whole, [None, lanes])
        sch.vectorize(lane)
        for piece, width in zip(tail, pieces):
            if width > 1:
                sch.vectorize(piece)
        return None
    vector = lanes_for(extent, lanes)
    if vector < 4:
        return loop
    rest, lane = sch.split(loop, [None, vector])
    sch.vectorize(lane)
    return rest


def parallelize(sch: s_tir.Schedule, block, lanes: int) -> None:
    """Run a spatial loop nest on the thread pool with its innermost loop vectorized.

    The innermost loop is vectorized (:func:`vectorize_inner`); every other leading spatial loop
    is fused into one parallel loop when the nest is large enough to pay for the threads (the
    vector loop's outer part too, unless its tail was partitioned off).
    """
    loops = sch.get_loops(block)
    if not loops:
        return
    spatial = len(loops)
    if loops_match_iters(sch, block):
        spatial = next((i for i, iv in enumerate(sch.get(block).iter_vars)
                        if iv.iter_type != tirx.IterVar.DataPar), len(loops))
    if spatial == 0:
        return
    total = 1
    for loop in loops[:spatial]:
        extent = static_extent(sch, loop)
        total = total * extent if extent is not None and total is not None else None
    outer = loops[:spatial]
    if spatial == len(loops):
        rest = vectorize_inner(sch, loops[-1], lanes)
        outer = loops[:spatial - 1] + ([rest] if rest is not None else [])
        if not outer:
            return
    if total is None or total >= MIN_PARALLEL_ELEMENTS:
        outer = outer[:_chunking_prefix(sch, outer)]
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])


#: A parallel loop is the fewest leading loops of a nest with at least this many iterations; the
#: loops inside stay nested. Fused into one, every element of the nest recomputed its indices by
#: division: the NCHW -> NHWC padding copy of a 224 x 224 RGB image (153228 elements, 3 a row)
#: took most of a stem conv's 0.51 ms on a 2-core Zen 3.
PARALLEL_CHUNKS = 64


def _chunking_prefix(sch: s_tir.Schedule, loops: list) -> int:
    """How many of ``loops`` (from the outside) the parallel loop fuses (see PARALLEL_CHUNKS);
    all of them where an extent is symbolic."""
    product = 1
    for count, loop in enumerate(loops, 1):
        extent = static_extent(sch, loop)
        if extent is None:
            return len(loops)
        product *= extent
        if product >= PARALLEL_CHUNKS:
            return count
    return len(loops)


def tail_pieces(tail: int) -> list[int]:
    """A vector loop's ``tail`` (fewer than a vector) as power-of-two pieces, widest first, each
    vectorized on its own: 13 columns as 8 + 4 + 1 (a 197 x 77 LayerNorm with a scalar loop of
    13 took 5.7-6.0 us, with the pieces 3.8-4.0; Zen 4, kernel alone)."""
    return [1 << bit for bit in reversed(range(tail.bit_length())) if tail >> bit & 1]
