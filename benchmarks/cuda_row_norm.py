"""LayerNorm in the wgmma GEMM's epilogue (``schedules/cuda/row_norm.py``, the
``layer_norm_epilogue`` rule on CUDA) against what the build runs without it: the wgmma GEMM
with the bias + residual epilogue, then the warp-per-row LayerNorm kernel
(``schedules/cuda/rows.py``). fp16 as the fp16 builds legalize BERT's
``LayerNorm(x @ W + b + h)``: float32 sums, the row element in fp16; N = 768.

    python3 benchmarks/cuda_row_norm.py [--rows 2048,3584,4096] [--depths 768,3072]
        [--tiles auto,192x3x1x2] --json OUT.json

A tile is ``block_n x stages x consumers x blocks_per_sm`` (:class:`WgmmaTile`), ``auto`` the
one :func:`choose_wgmma_tile` picks; each tile is timed fused and as the unfused GEMM. Row
counts whose clusters might not all fit one wave at once (4096 rows: 32 clusters of 4 blocks of
one SM each) show a wave step where the time per row jumps. Times are medians of TVM's
``time_evaluator`` (CUDA events); the fused kernel's output is checked against the unfused
pair's. Run on a machine with an NVIDIA GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import te

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tvmfuse.schedules.cuda.gemm_match import match_gemm  # noqa: E402
from tvmfuse.schedules.cuda.row_norm import match_gemm_row_norm  # noqa: E402
from tvmfuse.schedules.cuda.rows import WarpRows  # noqa: E402
from tvmfuse.schedules.cuda.wgmma_tile import WgmmaTile  # noqa: E402

N = 768
EPS = 1e-12
SM90 = {"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024,
        "max_shared_memory_per_block": 49152, "thread_warp_size": 32,
        "registers_per_block": 65536}
SM90A = tvm.target.Target({**SM90, "arch": "sm_90a", "host": "llvm"})


def gemm_residual(m: int, k: int):
    """``x = fp16(A @ W) + bias + residual`` and its placeholders (W stored [K, N])."""
    a = te.placeholder((m, k), "float16", name="A")
    w = te.placeholder((k, N), "float16", name="W")
    bias = te.placeholder((N,), "float16", name="bias")
    residual = te.placeholder((m, N), "float16", name="residual")
    r = te.reduce_axis((0, k), "k")
    acc = te.compute((m, N), lambda i, j: te.sum(
        a[i, r].astype("float32") * w[r, j].astype("float32"), axis=r), name="matmul")
    x = te.compute((m, N), lambda i, j: acc[i, j].astype("float16") + bias[j] + residual[i, j],
                   name="x")
    return (a, w, bias, residual), x


def layer_norm(x):
    """LayerNorm of ``x``'s rows as the fp16 builds legalize it, its placeholders gamma, beta."""
    m = x.shape[0]
    gamma, beta = (te.placeholder((N,), "float16", name=name) for name in ("gamma", "beta"))
    j = te.reduce_axis((0, N), "j")
    total = te.compute((m,), lambda i: te.sum(x[i, j].astype("float32"), axis=j), name="sum")
    j2 = te.reduce_axis((0, N), "j2")
    var = te.compute((m,), lambda i: te.sum(
        (x[i, j2].astype("float32") - total[i] / N) * (x[i, j2].astype("float32") - total[i] / N),
        axis=j2), name="var_sum")
    out = te.compute((m, N), lambda i, c: (
        (x[i, c].astype("float32") - total[i] / N) * tvm.tirx.rsqrt(var[i] / N + EPS)
    ).astype("float16") * gamma[c] + beta[c], name="out")
    return (gamma, beta), out


def kernels(m: int, k: int, tile: WgmmaTile | None):
    """(fused, gemm, norm): the built kernels."""
    inputs, x = gemm_residual(m, k)
    params, out = layer_norm(x)
    fused = match_gemm_row_norm(te.create_prim_func([*inputs, *params, out]))
    gemm = match_gemm(te.create_prim_func([*inputs, x]))
    xs = te.placeholder((m, N), "float16", name="x")
    norm_params, norm_out = layer_norm(xs)
    norm = te.create_prim_func([xs, *norm_params, norm_out])
    target = tvm.target.Target(SM90)
    with target:
        norm = WarpRows().apply(norm, target, False).mod["main"]

    def tirx(func):
        return tvm.compile(tvm.IRModule({"main": func}), target=SM90A, tir_pipeline="tirx")

    return (tirx(fused.kernel(tile)), tirx(gemm.kernel(tile)),
            tvm.compile(tvm.IRModule({"main": norm}), target=tvm.target.Target(
                {**SM90, "host": "llvm"})))


def median_us(lib, dev, args) -> float:
    timer = lib.mod.time_evaluator("main", dev, number=50, repeat=10)
    return float(np.median(timer(*args).results)) * 1e6


def measure(m: int, k: int, tile: WgmmaTile | None, dev) -> dict:
    fused, gemm, norm = kernels(m, k, tile)
    rng = np.random.default_rng(m + k)
    host = {"A": rng.standard_normal((m, k)), "W": rng.standard_normal((k, N)) / np.sqrt(k),
            "bias": rng.standard_normal(N), "residual": rng.standard_normal((m, N)),
            "gamma": rng.standard_normal(N), "beta": rng.standard_normal(N)}
    t = {name: tvm.runtime.tensor(v.astype("float16"), dev) for name, v in host.items()}
    w_nk = tvm.runtime.tensor(np.ascontiguousarray(host["W"].T).astype("float16"), dev)
    x, out, fused_out = (tvm.runtime.tensor(np.full((m, N), np.nan, "float16"), dev)
                         for _ in range(3))
    gemm_args = [t["A"], w_nk, t["bias"], t["residual"], x]
    norm_args = [x, t["gamma"], t["beta"], out]
    fused_args = [t["A"], w_nk, t["bias"], t["residual"], t["gamma"], t["beta"], fused_out]
    gemm(*gemm_args)
    norm(*norm_args)
    fused(*fused_args)
    want, got = out.numpy().astype("float32"), fused_out.numpy().astype("float32")
    result = {"rows": m, "k": k, "tile": str(tile or "auto"),
              "fused_us": median_us(fused, dev, fused_args),
              "gemm_us": median_us(gemm, dev, gemm_args),
              "norm_us": median_us(norm, dev, norm_args),
              "rel_diff": float(np.linalg.norm(got - want) / np.linalg.norm(want))}
    result["fused_over_pair"] = result["fused_us"] / (result["gemm_us"] + result["norm_us"])
    return result


def parse_tile(spec: str) -> WgmmaTile | None:
    return None if spec == "auto" else WgmmaTile(*map(int, spec.split("x")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="2048,3584,4096")
    parser.add_argument("--depths", default="768,3072", help="K of the GEMMs")
    parser.add_argument("--tiles", default="auto,192x3x1x2")
    parser.add_argument("--json", type=Path, required=True,
                        help="where to write the table (benchmarks/gpu.sh row-norm: $OUT)")
    args = parser.parse_args()
    dev = tvm.cuda(0)
    results = []
    for k in map(int, args.depths.split(",")):
        for m in map(int, args.rows.split(",")):
            for spec in args.tiles.split(","):
                try:
                    row = measure(m, k, parse_tile(spec), dev)
                except Exception as err:  # noqa: BLE001 - one failed variant, the rest still run
                    row = {"rows": m, "k": k, "tile": spec, "error": str(err).strip()[-300:]}
                    print(f"{m:5d}x{N}x{k:<5d} {spec:12s} failed: {row['error'][-120:]}")
                else:
                    print(f"{m:5d}x{N}x{k:<5d} {spec:12s} fused {row['fused_us']:7.1f} us  "
                          f"gemm {row['gemm_us']:7.1f} + norm {row['norm_us']:6.1f}  "
                          f"ratio {row['fused_over_pair']:.2f}  diff {row['rel_diff']:.1e}",
                          flush=True)
                results.append(row)
                args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
