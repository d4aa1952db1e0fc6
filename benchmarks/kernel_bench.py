"""One CPU kernel alone, variants interleaved: what the commits' kernel figures come from.

    .venv/bin/python benchmarks/kernel_bench.py dense --sizes 77,100,197 [--rows 197] [--depth 768]
                                                [--tiles auto,4x2,6x2] [--rounds 5]
    .venv/bin/python benchmarks/kernel_bench.py attention --sizes 49,197,1500 [--variants mod,...]
    .venv/bin/python benchmarks/kernel_bench.py layer_norm --sizes 64,77,197 [--rows 197]

``dense`` builds ``nn.Linear(depth, N)`` on ``[1, rows, depth]`` with tvmfuse (untuned) and times
its GEMM kernel with ``time_evaluator`` (:mod:`tvmfuse.profile`). ``attention`` builds the CPU
attention kernel (``schedules/cpu/attention.py``, or each module named in ``--variants`` that has
an ``attention_kernel(shape, cores=...)``: a copy with one change, to compare) for BERT-base's
heads (12 x 64, packed QKV, no mask) at each sequence length, checks it against NumPy, and times
it. ``layer_norm`` builds ``nn.LayerNorm(N)`` on ``[1, rows, N]`` (its weight and bias drawn
away from 1 and 0), checks the row reduction kernel against PyTorch and times it (GB/s: the input
read and the output written, as the shape sweep counts). Variants and sizes are timed in
interleaved rounds: on this shared machine a kernel's time drops by a third for seconds at a time
(a GEMM measured 161 GFLOP/s for eight profiles in a row, then 108 for the next eight, same
arguments), so each figure is the fastest round, with the median beside it; compare only within
one run.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("TVM_BIND_THREADS", "0")

import numpy as np  # noqa: E402
import tvm  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tvmfuse.passes.fuse_attention import AttentionShape  # noqa: E402
from tvmfuse.targets import get_target  # noqa: E402

HEADS, HEAD_DIM = 12, 64


def dense_kernels(sizes, rows, target, depth=768, tiles=("auto",)):
    """(label, FLOPs, library, function, arguments) per size and register tile: the GEMM kernel
    of a tvmfuse build of a linear layer, with the tile ``choose_tile`` picks (``auto``) or one
    forced (``RxB``: R rows of B vectors)."""
    import torch  # noqa: PLC0415
    from torch import nn  # noqa: PLC0415

    from tvmfuse import api, compiler, profile  # noqa: PLC0415
    from tvmfuse.schedules.cpu import _blocked  # noqa: PLC0415 - the module builds use

    chosen = _blocked.choose_tile
    for n in sizes:
        for tile in tiles:
            if tile != "auto":
                rows_, blocks = (int(v) for v in tile.split("x"))
                _blocked.choose_tile = lambda r, c, vector, **_: _blocked.Tile(
                    rows_, blocks, vector.lanes)
            torch.manual_seed(0)
            model = api.import_torch(nn.Linear(depth, n).eval(), [torch.randn(1, rows, depth)],
                                     name=f"linear{n}")
            try:
                built = compiler.compile_model(model, target, api.BuildOptions(use_database=False))
            finally:
                _blocked.choose_tile = chosen
            info = built.analysis.kernel_info
            name = max(built.analysis.kernels, key=lambda k: info[k].flops)
            library = built.executable.mod.imports[0]
            args = profile.random_args(info[name].params, target.device_here())
            implementation = built.analysis.implementations.get(name, "default")
            yield (f"{rows}x{depth}x{n} {tile} ({implementation})", info[name].flops, library,
                   name, args)


def layer_norm_kernels(sizes, rows, target):
    """(label, bytes, library, function, arguments) per row length: the row reduction kernel of
    a tvmfuse build of a LayerNorm, checked against PyTorch first."""
    import torch  # noqa: PLC0415
    from torch import nn  # noqa: PLC0415

    from tvmfuse import api, compiler  # noqa: PLC0415

    device = tvm.cpu()
    for n in sizes:
        torch.manual_seed(n)
        norm, x = nn.LayerNorm(n).eval(), torch.randn(1, rows, n)
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-1.0, 1.0)
            want = norm(x).numpy()
        model = api.import_torch(norm, [x], name=f"layer_norm{n}")
        built = compiler.compile_model(model, target, api.BuildOptions(use_database=False))
        implementations = built.analysis.implementations
        name = next(k for k in built.analysis.kernels
                    if implementations.get(k) == "cpu.row_reduction")
        library = built.executable.mod.imports[0]
        args = [tvm.runtime.tensor(a, device) for a in (
            x.numpy(), norm.weight.detach().numpy(), norm.bias.detach().numpy(),
            np.zeros_like(want))]
        library[name](*args)
        error = np.abs(args[-1].numpy() - want).max()
        if error > 1e-5:
            raise SystemExit(f"layer_norm over {n} columns: max error {error:.1e}")
        yield f"{rows}x{n} layer_norm", 2 * rows * n * 4, library, name, args


def attention_kernels(sizes, variants, target):
    """(label, FLOPs, library, function, arguments) per size and variant, each checked against
    NumPy first."""
    device = tvm.cpu()
    cores = int(target.config.get("num-cores", 1))
    width = 3 * HEADS * HEAD_DIM
    for seq in sizes:
        rng = np.random.default_rng(seq)
        x = rng.standard_normal((1, seq, width)).astype("float32")
        want = _attention_reference(x)
        shape = AttentionShape(1, seq, HEADS, HEAD_DIM, q=(width, 0), k=(width, HEADS * HEAD_DIM),
                               v=(width, 2 * HEADS * HEAD_DIM), mask=(1, 1, 1, 1),
                               scale=HEAD_DIM ** -0.5)
        for variant in variants:
            kernel = importlib.import_module(variant).attention_kernel(
                shape, lanes=target.vector.lanes, registers=target.vector.registers, cores=cores)
            library = tvm.compile(tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")}),
                                  target=target.tvm_target()).mod
            args = [tvm.runtime.tensor(a, device) for a in (x, x, x, np.zeros((1, 1, 1, 1),
                                                                                "float32"))]
            out = tvm.runtime.tensor(np.zeros((1, seq, HEADS * HEAD_DIM), "float32"), device)
            library["main"](*args, out)
            error = np.linalg.norm(out.numpy() - want) / np.linalg.norm(want)
            if error > 1e-5:
                raise SystemExit(f"{variant} at {seq} tokens: relative error {error:.1e}")
            yield (f"S={seq} {variant.rsplit('.', 1)[-1]}", 4 * seq * seq * HEADS * HEAD_DIM,
                   library, "main", [*args, out])


def _attention_reference(x):
    seq = x.shape[1]

    def heads(part):
        start = part * HEADS * HEAD_DIM
        return x[0, :, start:start + HEADS * HEAD_DIM].reshape(seq, HEADS, HEAD_DIM).transpose(
            1, 0, 2)

    q, k, v = heads(0), heads(1), heads(2)
    scores = q @ k.transpose(0, 2, 1) * HEAD_DIM ** -0.5
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return (probs @ v).transpose(1, 0, 2).reshape(1, seq, HEADS * HEAD_DIM)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=("dense", "attention", "layer_norm"))
    parser.add_argument("--sizes", required=True,
                        help="columns (dense, layer_norm) or tokens (attention)")
    parser.add_argument("--rows", type=int, default=197,
                        help="dense, layer_norm: rows of the input")
    parser.add_argument("--depth", type=int, default=768, help="dense: the reduction (K)")
    parser.add_argument("--variants", default="schedules.cpu.attention",
                        help="attention: modules with attention_kernel(), comma-separated")
    parser.add_argument("--tiles", default="auto",
                        help="dense: register tiles, comma-separated: auto (the one chosen) or "
                             "RxB (R rows of B vectors, forced)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cold", action="store_true",
                        help="flush every argument but the first (the input) from the caches "
                             "before each run: the weights come from memory, as in a model")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    target = get_target()
    os.environ.setdefault("TVM_NUM_THREADS", str(target.config.get("num-cores", 1)))
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.family == "dense":
        kernels = list(dense_kernels(sizes, args.rows, target, args.depth,
                                     args.tiles.split(",")))
    elif args.family == "layer_norm":
        kernels = list(layer_norm_kernels(sizes, args.rows, target))
    else:
        kernels = list(attention_kernels(sizes, args.variants.split(","), target))
    device = tvm.cpu()
    seconds = {label: [] for label, *_ in kernels}
    for _ in range(args.rounds):
        for label, _, library, name, call_args in kernels:
            timer = (library.time_evaluator(name, device, number=1, repeat=20,
                                            f_preproc="cache_flush_cpu_non_first_arg")
                     if args.cold else
                     library.time_evaluator(name, device, number=1, repeat=5, min_repeat_ms=40))
            seconds[label].append(min(timer(*call_args).results))
    unit = "GB/s" if args.family == "layer_norm" else "GFLOP/s"
    for label, work, *_ in kernels:
        best, median = min(seconds[label]), statistics.median(seconds[label])
        print(f"{label:36s} {work / best / 1e9:7.1f} {unit} (median round "
              f"{work / median / 1e9:7.1f}; {best * 1e6:.2f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
