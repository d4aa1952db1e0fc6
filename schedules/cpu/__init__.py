"""Hand-written schedules for CPUs (AVX-512, AVX2/SSE, NEON), one file per op family.

The rules are written once for any LLVM CPU and take the vector unit (:class:`Vector`) as a
parameter: what differs between AVX-512 and NEON here is the width of a register and how many
there are, which set the register tile; LLVM picks the instructions (``vfmadd231ps`` on zmm
registers for AVX-512, ``fmla`` for NEON). :func:`rules` lists them in the order the schedule
phase tries them: the first that returns a schedule wins.
"""

from __future__ import annotations

from ._tir import Vector
from .conv2d import Conv2D, DepthwiseConv2D
from .dense import Dense, DenseRowNorm
from .elementwise import Elementwise, Parallel, Transpose
from .pool import Pool
from .reduction import RowReduction
from .winograd import WinogradTransform

__all__ = ["Conv2D", "Dense", "DenseRowNorm", "DepthwiseConv2D", "Elementwise", "Parallel", "Pool",
           "RowReduction", "Transpose", "Vector", "WinogradTransform", "rules"]


def rules(vector: Vector) -> list:
    """The CPU schedule rules for ``vector``, most specific first, the catch-all last."""
    return [WinogradTransform(vector), Conv2D(vector), DepthwiseConv2D(vector), Dense(vector),
            DenseRowNorm(vector),
            Pool(vector), RowReduction(vector), Transpose(vector), Elementwise(vector),
            Parallel(vector)]
