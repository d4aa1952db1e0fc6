"""fp16 GEMMs on the GPU host: tvmfuse's tensor-core schedule (``schedules/cuda/matmul.py``)
against dlight's default for the same kernel and ``torch.matmul``, at 4096^3 and at BERT-base's
and ResNet-50's GEMM shapes (and sizes no tile divides). Each kernel is ``out = fp16(A @ B +
bias)``, fp16 operands, float32 accumulation; every result is checked against float32 NumPy.

    python3 benchmarks/cuda_gemm.py [--shapes M,N,K;...] --json OUT.json
    python3 benchmarks/cuda_gemm.py --tiles auto,2x4x4x4x4x3,... --no-dlight   # a tile sweep
    python3 benchmarks/cuda_gemm.py --tiles auto,wgmma,wg128x6                 # with wgmma
    python3 benchmarks/cuda_gemm.py --tiles auto,mk,mk2x2x64x64x3              # hand-written mma

A tile is ``warps_m x warps_n x frag_m x frag_n x chunk_k x stages[x blocks_per_sm]``
(:class:`MmaTile`); ``auto`` is the one :func:`choose_tile` picks. ``wgmma`` is the Hopper
kernel of ``schedules/cuda/wgmma.py`` with the tile :func:`choose_wgmma_tile` picks,
``wg<block_n>x<stages>`` a given one (its B is stored [N, K] whatever ``--weight-nk`` says:
wgmma reads both operands K-major). ``mk`` is the hand-written mma.sync kernel of
``schedules/cuda/mma_gemm.py`` (B [N, K] too) with its default tile, ``mk<warps_m>x<warps_n>x
<warp_m>x<warp_n>x<stages>[x<copy_at>x<blocks_per_sm>]`` a given one. The JSON is rewritten after
every shape, so a run cut short keeps what it measured.

Times are CUDA-event medians (``triton.testing.do_bench`` where torch runs, TVM's
``time_evaluator`` for ours); TFLOP/s count 2 M N K. Run on a machine with an NVIDIA GPU.
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

from tvm.s_tir import dlight as dl  # noqa: E402

from tvmfuse.schedules.cuda import mma_gemm  # noqa: E402
from tvmfuse.schedules.cuda.matmul import MmaTile, TensorCoreMatmul, choose_tile  # noqa: E402
from tvmfuse.schedules.cuda.wgmma import gemm_kernel  # noqa: E402
from tvmfuse.schedules.cuda.wgmma_tile import WgmmaTile  # noqa: E402

#: (label, M, N, K): BERT-base's GEMMs at batch 1 and 32 (seq 128), ResNet-50's 1x1 convs as
#: GEMMs at batch 32 (56x56 and 7x7 maps), its classifier, and sizes no tile divides.
SHAPES = (
    ("square 4096", 4096, 4096, 4096),
    ("BERT b32 QKV", 4096, 2304, 768),
    ("BERT b32 out", 4096, 768, 768),
    ("BERT b32 FFN1", 4096, 3072, 768),
    ("BERT b32 FFN2", 4096, 768, 3072),
    ("BERT b1 QKV", 128, 2304, 768),
    ("BERT b1 FFN1", 128, 3072, 768),
    ("BERT b1 FFN2", 128, 768, 3072),
    ("ResNet b32 1x1 56x56 64->256", 100352, 256, 64),
    ("ResNet b32 1x1 7x7 2048->512", 1568, 512, 2048),
    ("ResNet classifier b32", 32, 1000, 2048),
    ("ViT 197 tokens", 197, 768, 768),
    ("odd 1000^3", 1000, 1000, 1000),
    ("odd 77x100x33", 77, 100, 33),
)

TARGET = {"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024,
          "max_shared_memory_per_block": 49152, "thread_warp_size": 32,
          "registers_per_block": 65536}


def gemm_bias(m: int, n: int, k: int, weight_nk: bool = False):
    """The kernel as tvmfuse's fp16 builds legalize a linear layer: fp32 products summed,
    the bias added, the result cast to fp16; ``weight_nk`` stores B as torch stores a weight
    (and an OHWI conv its filter): [N, K]."""
    a = te.placeholder((m, k), "float16", name="A")
    b = te.placeholder((n, k) if weight_nk else (k, n), "float16", name="B")
    bias = te.placeholder((n,), "float16", name="bias")
    r = te.reduce_axis((0, k), "k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r].astype("float32") * (
        b[j, r] if weight_nk else b[r, j]).astype("float32"), axis=r), name="matmul")
    out = te.compute((m, n), lambda i, j: (c[i, j] + bias[j].astype("float32")).astype(
        "float16"), name="T_add")
    return te.create_prim_func([a, b, bias, out])


def build(func, target, ours: bool, tile: MmaTile | None = None):
    if ours:
        sch = TensorCoreMatmul(tile=tile).apply(func, target, False)
        if sch is None:
            return None
        mod = sch.mod
    else:
        with target:
            mod = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Fallback())(
                tvm.IRModule({"main": func}))
    with target, tvm.transform.PassContext(config={"tirx.use_async_copy": True}):
        return tvm.compile(tvm.IRModule({"main": mod["main"].with_attr("global_symbol", "main")}),
                           target=target)


def build_wgmma(m: int, n: int, k: int, tile: WgmmaTile | None):
    """The wgmma kernel with the same bias epilogue, B [N, K]; sm_90a (wgmma's arch)."""
    from tvm.script import tirx as T  # noqa: PLC0415

    bias = tvm.tirx.decl_buffer((n,), "float16", name="bias")
    func = gemm_kernel(m, n, k, tile, epilogue=lambda acc, row, col: T.Cast(
        "float16", acc + T.Cast("float32", bias[col])), extra=(bias,))
    target = tvm.target.Target({**TARGET, "arch": "sm_90a"})
    return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def build_mma_kernel(m: int, n: int, k: int, tile: mma_gemm.MmaGemmTile | None):
    """The hand-written mma.sync kernel with the same bias epilogue, B [N, K]."""
    from tvm.script import tirx as T  # noqa: PLC0415

    bias = tvm.tirx.decl_buffer((n,), "float16", name="bias")
    func = mma_gemm.gemm_kernel(m, n, k, tile, epilogue=lambda acc, row, col: T.Cast(
        "float16", acc + T.Cast("float32", bias[col])), extra=(bias,))
    target = tvm.target.Target({**TARGET, "arch": "sm_90a"})
    return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def parse_tile(spec: str) -> MmaTile | None:
    """``auto`` (None: choose_tile decides) or ``WMxWNxFMxFNxCKxST[xBL]``."""
    return None if spec == "auto" else MmaTile(*map(int, spec.split("x")))


def failure(err: Exception) -> dict:
    """An engine's failure for the table and the JSON: the last line of the error that says
    something (one run's only line was a NUL byte), and up to 2000 characters of the whole."""
    text = str(err).replace("\x00", "").strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return {"error": (lines[-1] if lines else type(err).__name__)[:200], "detail": text[-2000:]}


def run_and_time(lib, dev, args, want, flops: float) -> dict:
    """Run once (the output, the last of ``args``, poisoned with NaN first: every element must
    be written), check against ``want``, time; TFLOP/s of ``flops`` a run."""
    out = args[-1]
    out.copyfrom(np.full(out.shape, np.nan, "float16"))
    lib["main"](*args)
    got = out.numpy().astype("float32")
    timer = lib.mod.time_evaluator("main", dev, number=20, repeat=10)
    ms = float(np.median(timer(*args).results)) * 1e3
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    return {"ms": ms, "tflops": flops / ms / 1e9,
            "rel_err": err if np.isfinite(err) else "nan (unwritten or overflowed outputs)"}


def fmt(r) -> str:
    if not r:
        return "         -"
    if "error" in r:
        return f"failed: {r['error']}"
    err = r["rel_err"]
    return f"{r['ms']:8.4f} ms {r['tflops']:6.1f} TF/s err " + (
        f"{err:.1e}" if isinstance(err, float) else err)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", help="M,N,K;M,N,K... instead of the default list")
    parser.add_argument("--tiles", default="auto",
                        help="comma-separated tiles of our schedule to time (see above)")
    parser.add_argument("--no-dlight", action="store_true", help="skip dlight's schedule")
    parser.add_argument("--weight-nk", action="store_true",
                        help="B stored [N, K], as a linear layer's weight (default [K, N])")
    parser.add_argument("--json", type=Path, required=True,
                        help="where to write the table (benchmarks/gpu.sh gemm: $OUT)")
    args = parser.parse_args()
    import torch  # noqa: PLC0415 - on the GPU host
    from triton.testing import do_bench  # noqa: PLC0415

    shapes = SHAPES if not args.shapes else [
        (s, *map(int, s.split(","))) for s in args.shapes.split(";")]
    tiles = args.tiles.split(",")
    target = tvm.target.Target(TARGET)
    dev = tvm.cuda(0)
    rng = np.random.default_rng(0)
    rows = []
    for label, m, n, k in shapes:
        a, b = (rng.standard_normal(s).astype("float16") for s in ((m, k), (k, n)))
        bias = rng.standard_normal(n).astype("float16")
        want = a.astype("float32") @ b.astype("float32") + bias.astype("float32")
        stored_b = np.ascontiguousarray(b.T) if args.weight_nk else b
        tensors = [tvm.runtime.tensor(x, dev) for x in (a, stored_b, bias)]
        tensors.append(tvm.runtime.tensor(np.zeros((m, n), "float16"), dev))
        b_nk = tensors[1] if args.weight_nk else tvm.runtime.tensor(np.ascontiguousarray(b.T), dev)
        row = {"shape": label, "m": m, "n": n, "k": k, "auto": str(choose_tile(1, m, n, k)),
               "tiles": {}}
        print(f"{label:30s} {m}x{n}x{k} (auto: {row['auto']})", flush=True)
        engines = [(spec, True) for spec in tiles] + ([] if args.no_dlight else [("dlight", False)])
        for spec, ours in engines:
            try:
                if spec.startswith("mk"):
                    lib = build_mma_kernel(m, n, k, None if spec == "mk" else
                                           mma_gemm.MmaGemmTile(*map(int, spec[2:].split("x"))))
                    result = run_and_time(lib, dev, [tensors[0], b_nk, *tensors[2:]], want,
                                          2 * m * n * k)
                elif spec.startswith("wg"):
                    lib = build_wgmma(m, n, k, None if spec == "wgmma" else WgmmaTile(
                        *map(int, spec[2:].split("x"))))
                    result = run_and_time(lib, dev, [tensors[0], b_nk, *tensors[2:]], want,
                                          2 * m * n * k)
                else:
                    tile = parse_tile(spec) if ours else None
                    lib = build(gemm_bias(m, n, k, args.weight_nk), target, ours, tile)
                    result = None if lib is None else run_and_time(lib, dev, tensors, want,
                                                                   2 * m * n * k)
            except Exception as err:  # noqa: BLE001 - one tile failing must not end the sweep
                result = failure(err)
            if ours:
                row["tiles"][spec] = result
            else:
                row["dlight"] = result
            print(f"  {spec:14s} {fmt(result)}", flush=True)
        ta, tb, tbias = (torch.from_numpy(x).cuda() for x in (a, b, bias))
        ms = do_bench(lambda: torch.addmm(tbias, ta, tb), warmup=25, rep=200,
                      return_mode="median")
        got = torch.addmm(tbias, ta, tb).float().cpu().numpy()
        row["torch"] = {"ms": ms, "tflops": 2 * m * n * k / ms / 1e9,
                        "rel_err": float(np.linalg.norm(got - want) / np.linalg.norm(want))}
        print(f"  {'torch':14s} {fmt(row['torch'])}", flush=True)
        row["weight_nk"] = args.weight_nk
        rows.append(row)
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "tiles": tiles,
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
