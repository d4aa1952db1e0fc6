"""GFLOP/s of each CPU schedule over shapes, odd and even, next to ONNX Runtime on the same
shapes: one small PyTorch module per point (a linear layer, an attention layer, a conv, a
depthwise conv, a LayerNorm), built by tvmfuse untuned (``use_database=False``) and timed with
ONNX Runtime in interleaved rounds by ``tvmfuse.bench`` (wall clock, medians).

    python benchmarks/shape_sweep.py [--families dense,attention,...] [--repeat N]
        [--sizes 77,197] --json benchmarks/results/KIND/shape-sweep.json

``--sizes`` measures only those points again and puts them in place of the same points of the
JSON, the summaries recomputed over the whole family.

For every family it prints each point's GFLOP/s (GB/s for LayerNorm, which does no FMAs) from the
median and from the fastest run of the whole module, beside ONNX Runtime's, then the schedule's
own rate (``kernel``: its kernels timed alone, see :func:`_schedule_rate`), and for each figure
the worst share of the family's best at sizes of at least 64 that are not a multiple of 16 (one
AVX-512 vector): the issue's "no schedule below 70% of its best at non-multiple sizes" is the
``kernel_rate`` line. A one-layer module's latency is not the schedule's: a 197 x 77 LayerNorm's
10 us call is half fixed cost, and a 3x3 conv's module converts NCHW to NHWC and back each call.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
from pathlib import Path

os.environ.setdefault("TVM_BIND_THREADS", "0")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from tvmfuse import api, compiler, profile  # noqa: E402
from tvmfuse.bench.session import bench  # noqa: E402
from tvmfuse.targets import get_target  # noqa: E402


class Attention(nn.Module):
    """BERT-base's self-attention core: 12 heads of 64, packed QKV, no mask."""

    def __init__(self, dim=768, heads=12):
        super().__init__()
        self.heads, self.qkv = heads, nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, -1))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(
            b, s, d)


class ChannelsLast(nn.Module):
    """A conv between NHWC tensors, as it runs inside a model once tvmfuse has changed the
    layout: the permutes at its ends cancel those of the layout change."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        self.conv = conv

    def forward(self, x):
        return self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


def _points(family: str):
    """(label, size, module, inputs, bytes) per point; ``size`` is the swept extent."""
    if family == "dense":  # rows (tokens) and columns (features) swept around BERT's 768
        for m in (1, 7, 49, 50, 64, 77, 128, 197, 256, 577, 1024, 1500, 4096):
            yield f"M={m} K=768 N=768", m, nn.Linear(768, 768), [torch.randn(1, m, 768)], None
        for n in (64, 77, 100, 197, 384, 1000, 1024, 3072, 4095):
            yield f"M=197 K=768 N={n}", n, nn.Linear(768, n), [torch.randn(1, 197, 768)], None
    elif family == "attention":  # sequence swept; the projection GEMM is part of the module
        for s in (1, 7, 49, 50, 64, 77, 128, 197, 256, 577, 1024, 1500):
            yield f"S={s} H=12 D=64", s, Attention(), [torch.randn(1, s, 768)], None
    elif family == "conv":  # 3x3 convs: channels and spatial sizes
        for c in (24, 40, 64, 77, 96, 112, 128, 192, 256):
            yield (f"3x3 {c}->{c} 28x28", c, nn.Conv2d(c, c, 3, padding=1),
                   [torch.randn(1, c, 28, 28)], None)
        for h in (7, 13, 14, 28, 49, 56, 112):
            yield (f"3x3 64->64 {h}x{h}", h, nn.Conv2d(64, 64, 3, padding=1),
                   [torch.randn(1, 64, h, h)], None)
    elif family == "depthwise":
        for c in (32, 72, 96, 144, 197, 240, 480, 672):
            yield (f"dw3x3 {c} 28x28", c, nn.Conv2d(c, c, 3, padding=1, groups=c),
                   [torch.randn(1, c, 28, 28)], None)
    elif family == "layer_norm":
        for n in (64, 77, 128, 197, 384, 768, 1000, 1024, 4096):
            yield (f"LN rows=197 cols={n}", n, nn.LayerNorm(n), [torch.randn(1, 197, n)],
                   2 * 197 * n * 4)


FAMILIES = ("dense", "attention", "conv", "depthwise", "layer_norm")


def _schedule_rate(family, size, model, target, options, report, nbytes) -> dict:
    """The schedule's own rate: its kernels timed alone with ``time_evaluator`` (see
    :mod:`tvmfuse.profile`; the fastest of five), without the call's fixed cost (about 5 us, most
    of a 197 x 77 LayerNorm's 10) and without the copies at the module's ends: a conv is built
    again between NHWC tensors (:class:`ChannelsLast`; taking and giving NCHW it converts both on
    every call, which a model does once, and a depthwise kernel read its input through the
    permute); every kernel of that build counts, its padded input's copy included. For the other
    families every kernel but zero-FLOP copies counts, or for attention only the attention
    kernel (the module's QKV projection is a dense GEMM)."""
    module = model.torch_module
    if isinstance(module, nn.Conv2d):  # timed as in a model: NHWC in and out, no copies
        nhwc = model.example_inputs[0].transpose(0, 2, 3, 1).copy()
        model = api.import_torch(ChannelsLast(module).eval(), [torch.from_numpy(nhwc)],
                                 name=f"{model.source} (NHWC)")
    compiled = compiler.compile_model(model, target, options)
    analysis = compiled.analysis
    # the fastest of five profiles per kernel: on this shared machine a kernel's time doubles
    # for seconds at a time (both engines' medians drop together)
    runs = [profile.profile(compiled.executable, target.device_here(), analysis.kernels,
                            analysis.implementations, analysis.kernel_info) for _ in range(5)]
    times = [min((t for run in runs for t in run if t.name == kernel.name), key=lambda t: t.ms)
             .to_json() for kernel in runs[0]]
    if family == "attention":
        mine = [t for t in times if t["implementation"] == "cpu.attention"]
        work = 4 * size * size * 768  # Q K^T and P V
    elif family == "layer_norm":
        mine, work = [t for t in times if t["implementation"] == "cpu.row_reduction"], nbytes
    elif family in ("conv", "depthwise"):  # NHWC in and out: every kernel is the conv's (a
        # padded input's copy too: a depthwise conv over 197 channels copies it apart, one over
        # 96 reads through the padding; without the copy, 197 channels would look like the
        # family's best)
        mine, work = times, report.flops
    else:
        mine = [t for t in times if t["flops"] or t["implementation"] != "cpu.elementwise"]
        work = report.flops
    ms = sum(t["ms"] for t in mine)
    return {"kernel_rate": work / ms / 1e6, "kernel_ms": ms,
            "implementation": "+".join(sorted({t["implementation"] for t in mine})),
            "other_kernels_ms": sum(t["ms"] for t in times) - ms}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--sizes", help="only these swept sizes (comma-separated): their points "
                                        "replace the same points in the JSON (a point measured "
                                        "in a slow period, measured again)")
    parser.add_argument("--json", type=Path, required=True,
                        help="benchmarks/results/<machine-kind>/shape-sweep.json (with --sizes: "
                             "the file whose points are replaced)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    target = get_target()
    threads = int(target.config.get("num-cores", 1))
    options = api.BuildOptions(use_database=False)
    results = {"machine": platform.processor() or platform.machine(), "target": target.name,
               "threads": threads, "families": {}}
    earlier = json.loads(args.json.read_text())["families"] if args.json.exists() else {}
    for family in args.families.split(","):
        rows = []
        for label, size, module, inputs, nbytes in _points(family):
            if args.sizes and str(size) not in args.sizes.split(","):
                continue
            torch.manual_seed(0)
            model = api.import_torch(module.eval(), inputs, name=label)
            report = bench(model, target, ["tvmfuse", "onnxruntime"], options=options,
                           threads=threads, repeat=args.repeat, max_seconds=20, peak=False)
            by = {r.engine: r for r in report.results}
            row = {"point": label, "size": size, "flops": report.flops, "bytes": nbytes}
            for engine, r in by.items():
                work = nbytes or report.flops
                row[f"{engine}_ms"] = r.median_ms
                row[f"{engine}_rate"] = work / r.median_ms / 1e6
                # the fastest run: what the kernel does when nothing else takes the cores (on
                # this shared machine both engines' medians drop together for seconds at a time)
                row[f"{engine}_best_rate"] = work / r.min_ms / 1e6
            row["kernels"] = by["tvmfuse"].kernels if "tvmfuse" in by else None
            row.update(_schedule_rate(family, size, model, target, options, report, nbytes))
            rows.append(row)
            print(f"{family:10s} {label:24s} tvmfuse {row.get('tvmfuse_rate') or 0:7.1f} "
                  f"(best run {row.get('tvmfuse_best_rate') or 0:7.1f})  onnxruntime "
                  f"{row.get('onnxruntime_rate') or 0:7.1f} (best run "
                  f"{row.get('onnxruntime_best_rate') or 0:7.1f})  kernel "
                  f"{row['kernel_rate']:7.1f} ({row['implementation']}) "
                  f"{'GB/s' if nbytes else 'GFLOP/s'}", flush=True)
        if args.sizes:  # the family's other points as last measured
            rows = _merged(earlier.get(family, {}).get("points", []), rows)
        results["families"][family] = _summary(family, rows)
    # the families not run keep their last results
    results["families"] = {**earlier, **results["families"]}
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


def _merged(earlier: list, rows: list) -> list:
    """``earlier``'s points in their order, each replaced by the one of ``rows`` with its label;
    points of ``rows`` that ``earlier`` lacks at the end."""
    fresh = {r["point"]: r for r in rows}
    merged = [fresh.pop(r["point"], r) for r in earlier]
    return merged + list(fresh.values())


def _summary(family: str, rows: list) -> dict:
    """The family's points and, for each rate, its best and its worst share of the best at a
    non-multiple size of at least 64 (printed)."""
    summary = {"points": rows}
    for key in ("kernel_rate", "tvmfuse_rate", "tvmfuse_best_rate"):
        best = max(r[key] for r in rows)
        odd = [r for r in rows if r["size"] >= 64 and r["size"] % 16]
        worst = min(odd, key=lambda r: r[key]) if odd else None
        summary[key] = {"best": best, "worst_odd": worst and {
            "point": worst["point"], "share_of_best": worst[key] / best}}
        if worst:
            print(f"{family} ({key}): best {best:.1f}; worst at a non-multiple size >= 64: "
                  f"{worst['point']} {worst[key] / best:.0%} of best", flush=True)
    return summary


if __name__ == "__main__":
    sys.exit(main())
