"""What the CPU schedule rules share: their base class, and parallelizing and vectorizing a loop
nest (target-neutral TensorIR helpers are in :mod:`tvmfuse.schedules.tir_util`)."""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl

from tvmfuse.targets import Vector

from ..tir_util import lanes_for, loops_match_iters, read_index_nodes, static_extent, uses

#: Below this many output elements a kernel runs on one thread: waking the pool costs more.
MIN_PARALLEL_ELEMENTS = 4096


class CpuRule(dl.ScheduleRule):
    """A hand-written CPU schedule rule: its ``name`` names it in the build report, and it blocks
    for ``vector``."""

    name: str
    #: The version of the rule's design space: raised whenever a change to the rule would make
    #: a record's trace from the earlier version replay differently (a build then ignores it).
    version: int = 1

    def __init__(self, vector: Vector):
        self.vector = vector

    def space(self, func: tirx.PrimFunc, target) -> list[s_tir.Schedule]:
        """The rule's design space for ``func``: schedules whose sampled decisions and
        structural choices the search explores, the untuned choice first; [] where the rule has
        none or does not take ``func`` (the search then takes MetaSchedule's generic space)."""
        return []


def vectorize_inner(sch: s_tir.Schedule, loop, lanes: int):
    """Vectorize ``loop``: ``lanes`` wide where it divides the loop or the loop is at least two
    vectors long (the loop then partitioned into whole vectors and a tail in narrower vectors,
    :func:`tail_pieces`: TVM runs a vector loop whose last vector is predicated one lane at a
    time, and LoopPartition leaves int64 loops alone; partitioned, 197 x 77 additions run in half
    the time); else the widest power-of-two vector of at least 4
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
    if _reads_or_writes_bool(sch, block):
        lanes = 1  # TVM's LLVM code would move a vector of bools as bits (_reads_or_writes_bool)
    total = 1
    for loop in loops[:spatial]:
        extent = static_extent(sch, loop)
        total = total * extent if extent is not None and total is not None else None
    outer = loops[:spatial]
    if spatial == len(loops):
        lanes = math.gcd(lanes, lane_period(sch, block, loops[-1]))
        if lanes < 4:  # split at the period all the same, so no `% period` spans the loop
            rest = sch.split(loops[-1], [None, lanes])[0] if lanes > 1 else loops[-1]
        else:
            rest = vectorize_inner(sch, loops[-1], lanes)
        outer = loops[:spatial - 1] + ([rest] if rest is not None else [])
        if not outer:
            return
    if total is None or total >= MIN_PARALLEL_ELEMENTS:
        outer = outer[:_chunking_prefix(sch, outer)]
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])


def lane_period(sch: s_tir.Schedule, block, loop) -> int:
    """The gcd of the power-of-two divisors ``d`` of every ``x % d`` and ``x // d`` the block
    reads at where ``x`` steps with ``loop`` (0: none). A vector must not cross such a period:
    LLVM's loop vectorizer (16 lanes) read a rotary embedding's ``cos[i * 8 + j % 8]``
    (``j & 7``), which TVM had left a scalar loop, as 16 consecutive floats over a head of 8:
    the next position's angles, and past the buffer on the last one. Within a period the index
    is affine in the lane."""
    var = sch.get(loop).loop_var
    realize = sch.get(loop).body
    if not isinstance(realize, s_tir.stmt.SBlockRealize):
        return 0
    lane_vars = [iv.var for iv, value in zip(sch.get(block).iter_vars, realize.iter_values)
                 if uses(value, var)]
    period = 0
    for node in read_index_nodes(sch.get(block)):
        if isinstance(node, (tirx.FloorMod, tirx.FloorDiv)) and isinstance(node.b, tirx.IntImm) \
                and _is_power_of_two(int(node.b.value)) \
                and any(_steps_with(node.a, v) for v in lane_vars):
            period = math.gcd(period, int(node.b.value))
    return period


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _steps_with(expr, var: tirx.Var) -> bool:
    """``var`` occurs in ``expr`` outside every floordiv and floormod."""
    if isinstance(expr, tirx.Var):
        return expr.same_as(var)
    if isinstance(expr, (tirx.FloorMod, tirx.FloorDiv)):
        return False
    return any(_steps_with(operand, var) for operand in (getattr(expr, "a", None),
                                                         getattr(expr, "b", None))
               if operand is not None)


def _reads_or_writes_bool(sch: s_tir.Schedule, block) -> bool:
    """The block loads or stores a boolean buffer: vectorized, TVM's LLVM code generator moves
    ``<n x i1>`` vectors, packed as bits, through buffers that hold a byte per boolean."""
    stmt = sch.get(block)
    return any(str(region.source.dtype) == "bool" for region in (*stmt.reads, *stmt.writes))


#: A parallel loop is the fewest leading loops of a nest with at least this many iterations; the
#: loops inside stay nested. Fused into one, every element of the nest recomputed its indices by
#: division: the NCHW -> NHWC padding copy of a 224 x 224 RGB image (153228 elements, 3 a row)
#: took most of a stem conv's time. 64 chunks keep two to sixteen threads evenly loaded.
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
    vectorized on its own: 13 columns as 8 + 4 + 1 (a 197 x 77 LayerNorm runs a third faster so
    than with a scalar loop of 13: ``kernel_bench.py layer_norm --sizes 77``)."""
    return [1 << bit for bit in reversed(range(tail.bit_length())) if tail >> bit & 1]
