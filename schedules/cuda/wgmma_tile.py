"""The wgmma GEMM kernel's tile (``wgmma.py``): the block's warpgroups, columns and pipeline
stages, their shared memory and registers, the tile :func:`choose_wgmma_tile` picks for a GEMM's
shape, and an NHWC conv read as the kernel's GEMM (:class:`ConvGeometry`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvmfuse.targets import SM90_GPU, GpuFacts

#: Columns of K a pipeline slot holds: 64 halves are one 128-byte swizzle row.
BLOCK_K = 64
#: wgmma's M per warpgroup.
WG_M = 16 * 4
#: Threads of a warpgroup.
WG_THREADS = 128
#: Registers ``setmaxnreg`` gives a producer thread: one thread of its warpgroup issues the
#: copies, so the rest of the register file goes to the consumers.
PRODUCER_REGISTERS = 40
#: The most registers ``setmaxnreg`` gives a consumer thread: two consumer warpgroups and the
#: producer fill the 64 Ki register file of an SM at 2 x 232 + 40 = 504 of its 512 a thread.
MAX_REGISTERS = 232
#: Registers a consumer thread needs beyond its accumulators, as ptxas allocates them for sm_90a
#: (154 for a 256-column tile's 128 accumulators).
ACCUMULATOR_OVERHEAD = 26
#: Floats of padding a staged accumulator row: rows 8 banks apart, not 32 (all in one bank).
STAGED_PAD = 8
#: Shared memory a block keeps out of the pipeline's reach for its mbarriers.
BARRIER_BYTES = 1024


@dataclass(frozen=True)
class WgmmaTile:
    """A thread block's tile: ``consumers`` warpgroups of 64 rows each, ``block_n`` columns
    (a multiple of 16 up to 256: wgmma's N), ``stages`` pipeline slots of 64 columns of K."""

    block_n: int = 256
    stages: int = 4
    consumers: int = 2
    #: Blocks an SM runs at once: two overlap one block's epilogue and pipeline start with the
    #: other's main loop, in half the registers and shared memory each.
    blocks_per_sm: int = 1

    @property
    def block_m(self) -> int:
        return self.consumers * WG_M

    def shared_bytes(self) -> int:
        """The pipeline's slots; the float32 accumulators are staged in the same memory."""
        pipeline = self.stages * (self.block_m + self.block_n) * BLOCK_K * 2
        return max(pipeline, self.block_m * (self.block_n + STAGED_PAD) * 4)

    def registers(self, gpu: GpuFacts = SM90_GPU) -> tuple[int, int]:
        """Registers a (consumer, producer) thread holds after ``setmaxnreg``: the block's
        share of ``gpu``'s register file, the producer's 128 threads kept to few (one issues
        copies)."""
        producer = PRODUCER_REGISTERS
        share = gpu.registers_per_sm // self.blocks_per_sm - WG_THREADS * producer
        return min(MAX_REGISTERS, share // (WG_THREADS * self.consumers) // 8 * 8), producer

    def validate(self, gpu: GpuFacts = SM90_GPU) -> None:
        """Raise ``ValueError`` where wgmma cannot take the tile or it does not fit ``gpu``."""
        if self.block_n % 16 or not 16 <= self.block_n <= 256:
            raise ValueError(f"block_n {self.block_n}: wgmma takes N a multiple of 16 up to 256")
        if self.blocks_per_sm not in (1, 2):
            raise ValueError(f"{self.blocks_per_sm} blocks an SM: one or two")
        available = gpu.shared_memory_per_block - BARRIER_BYTES
        if self.shared_bytes() * self.blocks_per_sm > available:
            raise ValueError(f"{self} needs {self.shared_bytes()} bytes of shared memory")
        # two blocks an SM: the launch bound caps every thread at its share of the file before
        # setmaxnreg moves registers, and a consumer holds its accumulators and about
        # ACCUMULATOR_OVERHEAD more
        cap = gpu.registers_per_sm // (self.blocks_per_sm * (self.consumers + 1) * WG_THREADS)
        if self.blocks_per_sm > 1 and self.block_n // 2 + ACCUMULATOR_OVERHEAD > cap:
            raise ValueError(f"{self} needs about {self.block_n // 2 + ACCUMULATOR_OVERHEAD} "
                             f"registers a thread where two blocks an SM allow {cap}")


#: A reduction of at most this many pipeline steps (64 of K each) is shallow: see
#: :func:`choose_wgmma_tile`.
SHALLOW_STEPS = 4


def choose_wgmma_tile(m: int, n: int, gpu: GpuFacts = SM90_GPU, conv: bool = False,
                      k_steps: int | None = None) -> WgmmaTile:
    """The tile with the most useful work per SM-wave of ``gpu``: blocks that fill the last
    wave, columns
    that are not past N (a 1x1 conv to 64 channels on 256-column tiles would waste 3/4);
    wider N first where two are within 5%.

    Two blocks an SM of one consumer each instead (twice the copies in flight, one block's
    epilogue and pipeline start overlapping the other's main loop) where a block's own work is
    short against those fixed costs:

    - a conv whose best tile is 64 columns wide (few output channels: the tile's columns are
      cheap, its rows few a block); convs whose best tile is wider lose more to the narrower
      two-block tile than they gain;
    - a shallow reduction (``k_steps`` up to :data:`SHALLOW_STEPS`: ResNet-50's 1x1 convs),
      at most 128 columns wide, so that two blocks' accumulators fit the register file.

    ``python3 benchmarks/cuda_conv.py --engines wgmma,wg64x4,wg64x4x1x2`` measures the choice
    at ResNet-50's conv shapes (``--shapes`` for others)."""
    best = None
    for block_n in (256, 192, 128, 64):
        tile = WgmmaTile(block_n=block_n)
        tiles_n = math.ceil(n / block_n)
        blocks = math.ceil(m / tile.block_m) * tiles_n
        sms = gpu.sm_count
        score = blocks / (math.ceil(blocks / sms) * sms) * n / (tiles_n * block_n)
        if best is None or score > best[0] * 1.05:
            best = (score, tile)
    if conv and best[1].block_n == 64 or k_steps is not None and k_steps <= SHALLOW_STEPS:
        return WgmmaTile(block_n=min(best[1].block_n, 128), consumers=1, blocks_per_sm=2)
    return best[1]


@dataclass(frozen=True)
class ConvGeometry:
    """An NHWC conv with an OHWI weight as the kernel's GEMM (an implicit GEMM): its rows are the
    output pixels, K runs over the window's taps and, within a tap, 64 input channels a
    pipeline step. A's tile for one step is the input under ``block_m`` output pixels shifted
    by the tap: ``segment`` pixels of one output row a TMA copy (4-D, strided by the conv's
    stride, zeros where the window hangs over the input's edge: the conv's padding), so the
    im2col matrix is never stored. Rows of a tile past an output row's end are computed from
    zeros and not stored."""

    batch: int
    height: int
    width: int
    channels: int
    out_height: int
    out_width: int
    window: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    #: zeros above and left of the input
    padding: tuple[int, int] = (0, 0)

    @property
    def segment(self) -> int:
        """Output pixels a copy loads: the width wasting the fewest rows at the end of an
        output row (56 -> 8, 28 -> 32, 14 -> 16, 7 -> 8), the wider where two waste as few."""
        return min((8, 16, 32, 64), key=lambda seg: (-(-self.out_width // seg) * seg, -seg))

    @property
    def segments_per_row(self) -> int:
        return -(-self.out_width // self.segment)

    @property
    def rows(self) -> int:
        """The GEMM's rows with each output row padded to whole segments."""
        return self.batch * self.out_height * self.segments_per_row * self.segment

    @property
    def channel_steps(self) -> int:
        return -(-self.channels // BLOCK_K)

    @property
    def k_steps(self) -> int:
        return self.window[0] * self.window[1] * self.channel_steps
