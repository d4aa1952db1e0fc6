"""The machine's practical peak in a build's precision, against which `tvmfuse bench --peak`
reports each engine: fp32 FMAs, or on a CPU with AVX-512 BF16, its bf16 pair dot product."""

from __future__ import annotations

import math
import time

import numpy as np
import tvm
from tvm import s_tir, te, tirx
from tvm.script import tirx as T

#: Two bf16 ones in one int32 lane: the pair :func:`dot_loop` multiplies by itself each step.
_ONE_PAIR = 0x3F803F80
#: Steps of the peak loops: each thread runs its chains of vector instructions this many times.
STEPS = 200_000


def measure_peak_gflops(target, threads: int, dtype: str = "float32") -> float:
    """The target's practical peak here in ``dtype``, in GFLOP/s: bfloat16 on a CPU whose core
    has AVX-512 BF16 is :func:`dot_loop`'s rate (``vdpbf16ps``: twice the FMAs of an fp32
    vector FMA; a bf16 build's GEMMs and convs use it), every other case the fp32 rate below.

    CPUs: a kernel of nothing but FMAs, generated for ``target`` (``target.vector``): each
    thread keeps 16 independent vector accumulators (enough chains to hide the FMA latency on
    both pipes) through a long loop: two AVX-512 FMA pipes a core reach their clock's worth.
    PyTorch's large sgemm ran well below it, below what tvmfuse's and ONNX Runtime's convs reach,
    so it is no peak. CUDA: the best of 10 strict fp32
    (no TF32) PyTorch sgemms of 8192^3.
    """
    if target.is_gpu:
        return _cuda_sgemm_gflops(8192)
    if dtype == "bfloat16" and target.vector is not None and target.vector.dot_bf16:
        return _gflops(*dot_loop(target, threads), flops_per_lane_step=4, steps=STEPS)
    return _gflops(*fma_loop(target, threads), flops_per_lane_step=2, steps=STEPS)


def _gflops(library, args, flops_per_lane_step: int, steps: int) -> float:
    """The rate of a loop kernel of ``steps`` steps over ``args[0]``'s threads x chains x lanes,
    its best of five timings of three runs."""
    seconds = min(library.time_evaluator("main", tvm.cpu(), number=3, repeat=5)(*args).results)
    return flops_per_lane_step * math.prod(args[0].shape) * steps / seconds / 1e9


def _chains(target) -> int:
    """Independent vector accumulators a peak loop keeps: as many as leave four of the vector
    registers free (see :func:`fma_loop`)."""
    return min(16, target.vector.registers - 4) if target.vector is not None else 16


def fma_loop(target, threads: int, chains: int | None = None, steps: int = STEPS):
    """The FMA-only kernel :func:`measure_peak_gflops` times, built for ``target``: the library
    and its arguments (``b``, then the accumulators written at the end). ``chains`` independent
    accumulators, by default as many as leave four of the vector registers free (16 on AVX-512;
    12 on AVX2, whose 16 registers hold 16 chains and the constant only by spilling one, which
    ran at a third of 12 chains' rate)."""
    lanes = target.vector.lanes if target.vector is not None else 1
    if chains is None:
        chains = _chains(target)
    # acc = acc * 0.999 + b, a reduction TE can express: one FMA per step
    decay = te.comm_reducer(lambda acc, b: acc * tirx.const(0.999, "float32") + b,
                            lambda dtype: tirx.const(0.0, dtype), name="decay")
    b = te.placeholder((threads, chains, lanes), name="b")
    step = te.reduce_axis((0, steps), name="step")
    acc = te.compute((threads, chains, lanes), lambda t, c, v: decay(b[t, c, v], axis=step),
                     name="acc")
    sch = s_tir.Schedule(te.create_prim_func([b, acc]))
    block = sch.get_sblock("acc")
    registers = sch.cache_write(block, 0, "local")
    thread, chain, lane, reduction = sch.get_loops(block)
    sch.reorder(thread, reduction, chain, lane)
    sch.parallel(thread)
    sch.unroll(chain)
    sch.vectorize(lane)
    sch.reverse_compute_at(registers, thread)
    sch.decompose_reduction(block, reduction)
    library = tvm.compile(sch.mod, target=target.tvm_target())
    device = tvm.cpu()
    args = [tvm.runtime.tensor(np.full((threads, chains, lanes), 1e-3, "float32"), device),
            tvm.runtime.tensor(np.zeros((threads, chains, lanes), "float32"), device)]
    return getattr(library, "mod", library), args


def dot_loop(target, threads: int, steps: int = STEPS):
    """A kernel of nothing but AVX-512 BF16 pair dot products (``vdpbf16ps``, through
    :mod:`tvmfuse.schedules.cpu.bf16_dot`'s function), built for ``target``: each thread adds
    ``1 * 1 + 1 * 1`` to as many 16-lane float32 accumulators as :func:`fma_loop` keeps, ``steps``
    times. The library and its arguments (the accumulators' start, then their end)."""
    from ..schedules.cpu import bf16_dot  # noqa: PLC0415 - the bf16 build's own instruction

    lanes, chains = bf16_dot.LANES, _chains(target)
    pair = T.broadcast(T.int32(_ONE_PAIR), lanes)

    @T.prim_func
    def main(start: T.Buffer((threads, chains, lanes), "float32"),
             end: T.Buffer((threads, chains, lanes), "float32")):
        for t in T.parallel(threads):
            acc = T.decl_buffer((chains * lanes,), "float32", scope="local")
            for c in T.unroll(chains):
                acc[T.ramp(c * lanes, 1, lanes)] = start[t, c, T.ramp(0, 1, lanes)]
            for _ in T.serial(steps, annotations={bf16_dot.IMPORT: bf16_dot.LLVM_IR}):
                for c in T.unroll(chains):
                    acc[T.ramp(c * lanes, 1, lanes)] = T.call_extern(
                        "float32x16", bf16_dot.FUNCTION, acc[T.ramp(c * lanes, 1, lanes)],
                        pair, pair)
            for c in T.unroll(chains):
                end[t, c, T.ramp(0, 1, lanes)] = acc[T.ramp(c * lanes, 1, lanes)]

    library = tvm.compile(tvm.IRModule({"main": main}), target=target.tvm_target())
    args = [tvm.runtime.tensor(np.zeros((threads, chains, lanes), "float32"), tvm.cpu())
            for _ in range(2)]
    return getattr(library, "mod", library), args


def _cuda_sgemm_gflops(size: int, repeat: int = 10) -> float:
    import torch  # noqa: PLC0415

    a, b = torch.randn(size, size, device="cuda"), torch.randn(size, size, device="cuda")
    torch.mm(a, b)  # TF32 is off: bench.session turns it off for CUDA runs
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        torch.mm(a, b)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9
