"""fp16 convs on the GPU host: tvmfuse's two tensor-core kernels for an NHWC conv (the
``mma.sync`` implicit GEMM of ``schedules/cuda/matmul.py`` and the wgmma one of
``schedules/cuda/wgmma.py``) against cuDNN (``torch.nn.functional.conv2d``, channels-last),
at ResNet-50's conv shapes at batch 32 and at sizes no tile divides. Each kernel is
``out = fp16(relu(conv(X, W) + bias))``, fp16 operands, float32 accumulation, checked against
float32 PyTorch.

    python3 benchmarks/cuda_conv.py [--shapes N,H,W,C,O,window,stride;...] [--engines mma,wgmma]
        [--residual] --json OUT.json

An engine is ``mma`` (the tile :func:`choose_tile` picks), ``wgmma`` (the tile
:func:`choose_wgmma_tile` picks) or ``wg<block_n>x<stages>[x<consumers>x<blocks an SM>]`` (a
given :class:`WgmmaTile`). Padding is ``window // 2``. cuDNN is timed on the conv with its bias
(its ReLU would be a second kernel). The JSON is rewritten after every shape. Times are
CUDA-event medians (TVM's ``time_evaluator``; ``triton.testing.do_bench`` for cuDNN); TFLOP/s
count 2 x outputs x K.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import te, topi

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_gemm import TARGET, build, failure, fmt, run_and_time  # noqa: E402

from tvmfuse.schedules.cuda.conv_match import match_conv  # noqa: E402
from tvmfuse.schedules.cuda.gemm_match import match_gemm  # noqa: E402
from tvmfuse.schedules.cuda.wgmma_tile import WgmmaTile  # noqa: E402

#: (label, N, H, W, C, O, window, stride): ResNet-50's convs at batch 32 (torchvision's v1.5:
#: the stride in the 3x3), then sizes no segment or tile divides.
SHAPES = (
    ("3x3 56x56 64", 32, 56, 56, 64, 64, 3, 1),
    ("3x3 28x28 128", 32, 28, 28, 128, 128, 3, 1),
    ("3x3 14x14 256", 32, 14, 14, 256, 256, 3, 1),
    ("3x3 7x7 512", 32, 7, 7, 512, 512, 3, 1),
    ("3x3 s2 56->28 128", 32, 56, 56, 128, 128, 3, 2),
    ("3x3 s2 28->14 256", 32, 28, 28, 256, 256, 3, 2),
    ("3x3 s2 14->7 512", 32, 14, 14, 512, 512, 3, 2),
    ("1x1 56x56 64->256", 32, 56, 56, 64, 256, 1, 1),
    ("1x1 28x28 128->512", 32, 28, 28, 128, 512, 1, 1),
    ("1x1 14x14 256->1024", 32, 14, 14, 256, 1024, 1, 1),
    ("1x1 56x56 256->64", 32, 56, 56, 256, 64, 1, 1),
    ("3x3 odd 17x23 72->100", 8, 17, 23, 72, 100, 3, 1),
)


def conv_bias_relu(n, h, w, c, o, window, stride, residual=False):
    """The kernel as tvmfuse's fp16 CUDA builds legalize and fuse a conv: topi's padding block,
    the NHWC conv with an OHWI weight summing in float32, bias, [a residual of the output's
    size,] ReLU, the cast to fp16."""
    pad = window // 2
    x = te.placeholder((n, h, w, c), "float16", name="X")
    weight = te.placeholder((o, window, window, c), "float16", name="W")
    bias = te.placeholder((o,), "float16", name="bias")
    oh, ow = ((size + 2 * pad - window) // stride + 1 for size in (h, w))
    res = te.placeholder((n, oh, ow, o), "float16", name="res")
    padded = topi.nn.pad(x, [0, pad, pad, 0], [0, pad, pad, 0], name="pad_temp")
    ry, rx, rc = (te.reduce_axis((0, e), name) for e, name in (
        (window, "ry"), (window, "rx"), (c, "rc")))
    conv = te.compute((n, oh, ow, o), lambda b, i, j, f: te.sum(
        padded[b, i * stride + ry, j * stride + rx, rc].astype("float32")
        * weight[f, ry, rx, rc].astype("float32"), axis=[ry, rx, rc]), name="conv2d_nhwc")
    out = te.compute(conv.shape, lambda *i: te.max(
        conv[i] + bias[i[-1]].astype("float32") + (res[i].astype("float32") if residual else 0),
        te.const(0, "float32")).astype("float16"), name="out")
    return te.create_prim_func([x, weight, bias, *([res] if residual else []), out])


def build_wgmma(func, spec: str):
    """The wgmma kernel of ``func`` (a 1x1 stride-1 conv as a GEMM, else an implicit GEMM)."""
    found = match_gemm(func) or match_conv(func)
    if found is None:
        return None
    tile = None if spec == "wgmma" else WgmmaTile(*map(int, spec[2:].split("x")))
    target = tvm.target.Target({**TARGET, "arch": "sm_90a"})
    return tvm.compile(tvm.IRModule({"main": found.kernel(tile)}), target=target,
                       tir_pipeline="tirx")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", help="N,H,W,C,O,window,stride;... instead of the default")
    parser.add_argument("--engines", default="mma,wgmma")
    parser.add_argument("--residual", action="store_true",
                        help="add a residual of the output's size before the ReLU (ResNet's "
                             "block ends; cuDNN then runs the add as a second kernel)")
    parser.add_argument("--json", type=Path, required=True,
                        help="where to write the table (benchmarks/gpu.sh conv: $OUT)")
    args = parser.parse_args()
    import torch  # noqa: PLC0415 - on the GPU host
    from triton.testing import do_bench  # noqa: PLC0415

    shapes = SHAPES if not args.shapes else [
        (s, *map(int, s.split(","))) for s in args.shapes.split(";")]
    target = tvm.target.Target(TARGET)
    dev = tvm.cuda(0)
    rng = np.random.default_rng(0)
    rows = []
    for label, n, h, w, c, o, window, stride in shapes:
        x = rng.standard_normal((n, h, w, c)).astype("float16")
        weight = (rng.standard_normal((o, window, window, c)) / np.sqrt(window * window * c)
                  ).astype("float16")
        bias = rng.standard_normal(o).astype("float16")
        oh, ow = ((size + 2 * (window // 2) - window) // stride + 1 for size in (h, w))
        res = rng.standard_normal((n, oh, ow, o)).astype("float16") if args.residual else None
        tx, tw, tb = (torch.from_numpy(v).cuda() for v in (x, weight, bias))
        tx = tx.permute(0, 3, 1, 2)  # NCHW view of NHWC memory: channels-last for cuDNN
        tw = tw.permute(0, 3, 1, 2)
        tr = None if res is None else torch.from_numpy(res).cuda().permute(0, 3, 1, 2)

        def cudnn(dtype=torch.float16):
            y = torch.nn.functional.conv2d(tx.to(dtype), tw.to(dtype), tb.to(dtype),
                                           stride=stride, padding=window // 2)
            return y if tr is None else y + tr.to(dtype)

        want = torch.relu(cudnn(torch.float32)).permute(0, 2, 3, 1).cpu().numpy()
        flops = 2 * want.size * window * window * c
        tensors = [tvm.runtime.tensor(v, dev) for v in (x, weight, bias)]
        tensors += [tvm.runtime.tensor(res, dev)] if res is not None else []
        tensors.append(tvm.runtime.tensor(np.zeros(want.shape, "float16"), dev))
        func = conv_bias_relu(n, h, w, c, o, window, stride, res is not None)
        row = {"shape": label, "conv": [n, h, w, c, o, window, stride], "engines": {},
               "residual": res is not None}
        print(f"{label:24s} {n}x{h}x{w}x{c} -> {o}, {window}x{window} /{stride}", flush=True)
        for spec in args.engines.split(","):
            try:
                lib = build(func, target, True) if spec == "mma" else build_wgmma(func, spec)
                result = None if lib is None else run_and_time(lib, dev, tensors, want, flops)
            except Exception as err:  # noqa: BLE001 - one engine failing must not end the sweep
                result = failure(err)
            row["engines"][spec] = result
            print(f"  {spec:14s} {fmt(result)}", flush=True)
        ms = do_bench(cudnn, warmup=25, rep=200, return_mode="median")
        got = torch.relu(cudnn()).float().permute(0, 2, 3, 1).cpu().numpy()
        row["cudnn"] = {"ms": ms, "tflops": flops / ms / 1e9,
                        "rel_err": float(np.linalg.norm(got - want) / np.linalg.norm(want))}
        print(f"  {'cudnn':14s} {fmt(row['cudnn'])}", flush=True)
        rows.append(row)
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                         "engines": args.engines, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
