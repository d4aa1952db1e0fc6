"""Write BENCHMARKS.md, and README.md's standings block, from ``benchmarks/results/``.

    python benchmarks/report.py            # rewrite BENCHMARKS.md (and README.md's block)
    python benchmarks/report.py --check    # exit 1 when either is not what this script makes
    python benchmarks/report.py --file benchmarks/results/zen4/vit-bf16.json   # file a new run

``benchmarks/results/<machine-kind>/<name>.json`` holds the latest results of one machine kind
(zen3, zen4, zen5, emeraldrapids, h200, ...): one JSON each, naming the machine kind, the commit
that measured it (``commit_is``: ``measured``, or ``added`` where only the commit that added the
file is known) and the command that reproduces it (``reproduce``); ``--file`` adds those three
to a ``tvmfuse bench --json`` report written there (the kind its folder, the commit git's HEAD,
the command the one the report names), then rewrites the files as without it. A file holds
either one ``tvmfuse bench`` report (``results``), several (``runs``: the suite), a shape sweep
(``families``), a tuning curve (``model_s_by_trials``), per-layer times (``tvmfuse_ms``) or kernel
counts (``inspect``). Replace a file with a newer run of the same thing; history stays in git.

README.md's block between the lines ``<!-- standings:begin -->`` and ``<!-- standings:end -->``
gets one short table per machine kind; a README.md without those lines is left alone.
Standard library only: the check runs in CI without TVM.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- standings:begin -->", "<!-- standings:end -->"

#: What each machine kind was, as its results' sessions recorded it (2 cores each for the CPUs).
MACHINES = {
    "zen3": "AMD Zen 3 (LLVM znver3, AVX2, no AVX-512), 2 cores",
    "zen4": "AMD EPYC Genoa (Zen 4, LLVM znver4, AVX-512), 2 cores",
    "zen5": "AMD EPYC Zen 5 (LLVM znver5, AVX-512), 2 cores",
    "emeraldrapids": "Intel Xeon Emerald Rapids (LLVM emeraldrapids, AVX-512), 2 cores, KVM",
    "h100": "NVIDIA H100 (sm_90), CUDA 13, PyTorch 2.11",
    "h200": "NVIDIA H200 (sm_90), CUDA 13, PyTorch 2.11",
}
#: Order of the sections; kinds not listed follow, by name.
ORDER = ["zen5", "zen4", "emeraldrapids", "zen3", "h200", "h100"]
ENGINES = {
    "onnxruntime": "ONNX Runtime",
    "onnxruntime-int8": "ONNX Runtime int8",
    "openvino": "OpenVINO",
    "openvino-fp32": "OpenVINO fp32",
    "torch-eager": "PyTorch eager",
    "torch-compile": "torch.compile",
    "torch-compile-freezing": "torch.compile (freezing)",
    "torch-compile-cudagraphs": "torch.compile + CUDA graphs",
    "stock-tvm": "stock TVM",
}
#: The GPU's headline rows in README.md (fp16, every batch measured).
HEADLINE_GPU = ("resnet50", "bert-base")
#: Engines that are tvmfuse itself (the ablation without fusion is no peer).
OURS = ("tvmfuse", "tvmfuse-unfused", "tvmfuse-untuned")
INTRO = """
Where tvmfuse stands today on each machine kind it was measured on. This file is written by
`python benchmarks/report.py` from `benchmarks/results/<machine-kind>/*.json`, the latest run of
each benchmark per machine kind (older runs are in git history): do not edit it by hand.

Engines run side by side in one `tvmfuse bench` process on identical inputs, in interleaved
rounds after warm-up runs; figures are medians in milliseconds. A ratio is tvmfuse's time over
its fastest peer's in the same run (below 1.0x, in bold: tvmfuse is faster), named beside the
ratio where a table has several. Peers: ONNX Runtime (and its static int8 quantization), OpenVINO
(in float32, and in the precision it picks itself: bf16 on CPUs with AVX-512 BF16), PyTorch eager,
torch.compile (default mode, with freezing, or with CUDA graphs on the GPU) and stock TVM; a peer
computing in another precision than the row's says which. Under each table: the machine, the
commit that measured it (`measured`; `added` where only the commit that added the JSON is known)
and the commands that reproduce it.
"""
DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int8": "int8"}


def load(results: Path) -> dict[str, dict[str, dict]]:
    """Every result file, by machine kind, then by file name without ``.json``."""
    kinds: dict[str, dict[str, dict]] = {}
    for path in sorted(results.glob("*/*.json")):
        kinds.setdefault(path.parent.name, {})[path.stem] = json.loads(path.read_text())
    return kinds


def kind_order(kind: str) -> tuple:
    return (ORDER.index(kind) if kind in ORDER else len(ORDER), kind)


def model_name(report: dict) -> str:
    """``benchmarks/suite/models.py:llama_decode`` -> ``llama-decode``; zoo names as they are."""
    return report["model"].rpartition(":")[2].replace("_", "-").replace("mobilenet-v2",
                                                                         "mobilenet_v2")


def engines(report: dict) -> dict[str, dict]:
    return {r["engine"]: r for r in report.get("results", ()) if r.get("median_ms") is not None}


def best_peer(report: dict) -> tuple[str, float] | None:
    peers = [(e, r["median_ms"]) for e, r in engines(report).items() if e not in OURS]
    return min(peers, key=lambda p: p[1]) if peers else None


def peer_label(engine: str, reports: list[dict]) -> str:
    """The peer's name, with the precision it computed in where that is not the report's (and
    its name does not already say it): ``OpenVINO bf16``."""
    label = ENGINES.get(engine, engine)
    own = {r["precision"] for report in reports
           for r in [engines(report).get(engine, {})] if r.get("precision") not in
           (None, report.get("dtype"))}
    if len(own) == 1:
        short = DTYPES.get(*own, *own)
        if short not in label:
            label += f" {short}"
    return label


def ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value >= 0.995 else f"{value:.3f}"


def ratio(ours: float | None, peer: float | None, bold_under: float = 1.0) -> str:
    if ours is None or not peer:
        return "-"
    text = f"{ours / peer:.2f}x"
    return f"**{text}**" if ours / peer < bold_under else text


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def provenance(kind: str, files: list[dict]) -> list[str]:
    """The line under every table: machine, commit(s), and the command(s) that reproduce it."""
    commits = sorted({f"{f['commit']} ({f['commit_is']})" for f in files})
    commands = list(dict.fromkeys(f["reproduce"] for f in files))
    return [f"Measured on {MACHINES.get(kind, kind)} (`{kind}`) at {', '.join(commits)}; "
            "reproduce:", "", *(f"- `{c}`" for c in commands), ""]


def table(header: list[str], rows: list[list[str]], right_from: int = 1) -> list[str]:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    return ["| " + " | ".join(row) + " |" for row in [header, align, *rows]]


def peers_of(reports: list[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for report in reports:
        for engine in engines(report):
            if engine not in OURS:
                seen[engine] = None
    return sorted(seen, key=lambda e: list(ENGINES).index(e) if e in ENGINES else 99)


def bench_table(reports: list[dict], first: str, label) -> list[str]:
    """One row per bench report: tvmfuse, every peer measured, tvmfuse over its best peer, and
    where a report measured the machine's peak (``--peak``), the share of it each reached."""
    peers = peers_of(reports)
    header = [first, "kernels", "tvmfuse ms", *(f"{peer_label(p, reports)} ms" for p in peers),
              "vs best peer", "error: tvmfuse / best peer"]
    with_peak = any(r.get("peak_gflops") for r in reports)
    if with_peak:
        header.append("share of peak: tvmfuse / best peer")
    rows = []
    for report in reports:
        if "error" in report:  # benchmarks/models.py keeps a model whose bench failed
            error = report["error"].replace("|", "\\|")
            rows.append([report["model"], *["-"] * (2 + len(peers)), f"failed: {error}", "-"]
                        + ["-"] * with_peak)
            continue
        by = engines(report)
        ours = by.get("tvmfuse", {})
        best = best_peer(report)
        versus = ratio(ours.get("median_ms"), best[1] if best else None)
        if best and len(peers) > 1 and versus != "-":  # which of the peers was the fastest
            versus += f" ({peer_label(best[0], [report])})"
        errors = [ours.get("rel_err"), by[best[0]].get("rel_err") if best else None]
        rows.append([label(report), str(ours.get("kernels", "-")), ms(ours.get("median_ms")),
                     *(ms(by[p]["median_ms"]) if p in by else "-" for p in peers), versus,
                     " / ".join("-" if e is None else f"{e:.1e}" for e in errors)])
        if with_peak:
            shares = [ours.get("fraction_of_peak"),
                      by[best[0]].get("fraction_of_peak") if best else None]
            rows[-1].append(" / ".join("-" if f is None else f"{f:.0%}" for f in shares))
    return table(header, rows, right_from=1)


def is_bench(data: dict) -> bool:
    return "results" in data and "model" in data


def zoo_files(files: dict[str, dict]) -> list[dict]:
    return [d for n, d in sorted(files.items()) if is_bench(d)]


def zoo_label(report: dict) -> str:
    text = f"{model_name(report)}, {DTYPES.get(report['dtype'], report['dtype'])}"
    return text + (f", b{report['batch']}" if report.get("batch", 1) != 1 else "")


#: The sets of ``benchmarks/models.py``: file name -> (their table's title in BENCHMARKS.md,
#: their row in the README's standings).
MODEL_SETS = {
    "suite": ("**The suite** (14 `transformers` architectures, fp32, batch 1, untuned, medians "
              "of 10):", "the suite (14 models), geomean"),
    "unseen": ("**Architectures never tuned for** (fp32, batch 1, untuned):",
               "8 unseen architectures, geomean"),
    "popular": ("**The twenty most downloaded architectures** (the coverage sweep's first "
                "twenty, at their published sizes: `tvmfuse build --list`; fp32, batch 1, "
                "untuned):", "the 20 most downloaded architectures, geomean"),
}


def set_ratios(runs: list[dict]) -> list[float]:
    """tvmfuse's median over its best peer's, for each run of a set that has both."""
    return [engines(r)["tvmfuse"]["median_ms"] / best_peer(r)[1] for r in runs
            if "tvmfuse" in engines(r) and best_peer(r)]


def cpu_section(kind: str, files: dict[str, dict]) -> list[str]:
    out = [f"## {MACHINES.get(kind, kind)} (`{kind}`)", ""]
    zoo = zoo_files(files)
    if zoo:
        out += ["**The zoo** (`tvmfuse bench`, batch 1, medians, milliseconds):", ""]
        out += bench_table(zoo, "model", zoo_label) + [""] + provenance(kind, zoo)
    for name, (title, _) in MODEL_SETS.items():
        if name in files:
            runs = files[name]["runs"]
            ratios = set_ratios(runs)
            out += [title, f"tvmfuse over its best peer, geometric mean {geomean(ratios):.2f}x "
                    f"({sum(r < 1 for r in ratios)} of {len(ratios)} faster).", ""]
            out += bench_table(runs, "model", model_name) + [""] + provenance(kind, [files[name]])
    if "coverage" in files:
        out += coverage_table(kind, files["coverage"])
    if "dynamic-seq" in files:
        out += dynamic_table(kind, files["dynamic-seq"])
    if "shape-sweep" in files:
        out += sweep_table(kind, files["shape-sweep"])
    for name, data in sorted(files.items()):
        if "model_s_by_trials" in data:
            out += tuning_table(kind, data)
        if "tune_gain" in data:
            out += tune_gain_table(kind, data)
        if "tvmfuse_in_place_ms" in data:
            out += per_layer_table(kind, data)
        if "inspect" in data:
            out += inspect_table(kind, data)
        if "build_time" in data:
            out += build_time_table(kind, data)
    unfused = [d for d in zoo if "tvmfuse-unfused" in engines(d)]
    if unfused:
        out += kernels_table(kind, unfused)
    return out


def coverage_table(kind: str, data: dict, top: int = 4) -> list[str]:
    """The coverage sweep (benchmarks/coverage.py): per path, how many model types exported,
    built and verified, and the largest failure causes with their counts."""
    records = data["coverage"]
    rows = []
    for path, label in (("torch", "torch.export"), ("onnx", "ONNX")):
        results = [r[path] for r in records if path in r]
        if not results:
            continue
        causes: dict[str, int] = {}
        for result in results:
            if result.get("cause"):
                causes[result["cause"]] = causes.get(result["cause"], 0) + 1
        largest = sorted(causes.items(), key=lambda c: (-c[1], c[0]))[:top]
        exported, built, verified = (sum(r[k] for r in results)
                                     for k in ("exported", "built", "verified"))
        rows.append([label, str(len(results)), str(exported), str(built), str(verified),
                     f"{verified / exported:.0%}" if exported else "-",
                     "; ".join(f"{_cell(c)} ({n})" for c, n in largest) or "-"])
    target = data.get("target", "this CPU")
    where = "on this CPU" if target == "this CPU" else f"for {target}, run on the GPU"
    out = ["**Coverage of transformers' AutoModel types** (`benchmarks/coverage.py`: small "
           f"configs, random weights, {data.get('dtype', 'fp32')}, built untuned and verified "
           f"{where}):", ""]
    out += table(["path", "model types", "exported", "built", "verified",
                  "verified of exported", "largest failure causes (model types)"], rows)
    out += [""] + provenance(kind, [data])
    out += ["Every failure after the export, by path and cause:", ""]
    for path, label in (("torch", "torch.export"), ("onnx", "ONNX")):
        groups: dict[str, list[str]] = {}
        for record in records:
            result = record.get(path, {})
            if result.get("exported") and not result.get("verified"):
                groups.setdefault(result.get("cause") or "?", []).append(record["type"])
        for cause, types in sorted(groups.items(), key=lambda g: (-len(g[1]), g[0])):
            out.append(f"- {label}, {_cell(cause)}: {', '.join(sorted(types))}")
    commits = sorted({r["commit"] for r in records if r.get("commit")})
    if len(commits) > 1:
        out += ["", f"The records were swept at commits {', '.join(commits)} (each record "
                    "names its own)."]
    return out + [""]


def _cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell."""
    return text.replace("|", "\\|")


def dynamic_table(kind: str, data: dict) -> list[str]:
    """One ``--dynamic seq`` build against a build per length (tvmfuse bench per length)."""
    by_length: dict[int, dict[bool, dict]] = {}
    for run in data["runs"]:
        words = run["command"].split()
        shape = words[words.index("--input-shape") + 1]
        length = int(shape.split(",")[1].split(":")[0])
        by_length.setdefault(length, {})["--dynamic" in words] = engines(run)
    rows = []
    for length, pair in sorted(by_length.items()):
        static, dyn = pair.get(False, {}), pair.get(True, {})
        st, dy = static.get("tvmfuse", {}), dyn.get("tvmfuse", {})
        ort = dyn.get("onnxruntime", {}).get("median_ms")
        rows.append([str(length), f"{ms(st.get('median_ms'))} ({st.get('kernels', '-')})",
                     f"{ms(dy.get('median_ms'))} ({dy.get('kernels', '-')})",
                     ratio(dy.get("median_ms"), st.get("median_ms"), 0),
                     ms(ort), ratio(dy.get("median_ms"), ort)])
    model = model_name(data["runs"][0])
    out = [f"**One `--dynamic seq` build of {model}** against a build per length (fp32, "
           "batch 1, untuned):", ""]
    out += table(["seq", "static build ms (kernels)", "dynamic build ms (kernels)",
                  "dynamic / static", "ONNX Runtime ms", "dynamic vs ORT"], rows)
    return out + [""] + provenance(kind, [data])


def sweep_table(kind: str, data: dict) -> list[str]:
    """Per family: tvmfuse over ONNX Runtime (median over the points, worst point), and the
    worst point's rate against the family's best (the schedules' awkward sizes)."""
    rows = []
    for family, fam in data["families"].items():
        points = fam["points"]
        pairs = [(p["tvmfuse_ms"] / p["onnxruntime_ms"], p["point"]) for p in points
                 if p.get("tvmfuse_ms") and p.get("onnxruntime_ms")]
        rates = [(p["tvmfuse_rate"], p["point"]) for p in points if p.get("tvmfuse_rate")]
        med = sorted(r for r, _ in pairs)[len(pairs) // 2] if pairs else None
        worst = max(pairs) if pairs else None
        low = min(rates) if rates else None
        rows.append([family, str(len(points)), f"{med:.2f}x" if med else "-",
                     f"{worst[0]:.2f}x ({worst[1]})" if worst else "-",
                     f"{low[0] / max(rates)[0]:.0%} ({low[1]})" if low else "-"])
    out = ["**The shape sweep** (one small model per point, tvmfuse against ONNX Runtime; "
           "rates in GFLOP/s, GB/s for LayerNorm):", ""]
    out += table(["family", "points", "median tvmfuse / ORT", "worst point / ORT",
                  "slowest rate / best rate"], rows, right_from=1)
    return out + [""] + provenance(kind, [data])


def tuning_table(kind: str, data: dict) -> list[str]:
    rows = []
    for mode, curve in data["model_s_by_trials"].items():
        reach = next(n for n, seconds in enumerate(curve) if seconds <= curve[-1] / 0.9)
        rows.append([mode, ms(curve[0] * 1e3), ms(curve[-1] * 1e3), str(reach)])
    out = [f"**Tuning curve** ({data['model']}, the top {len(data['kernels'])} kernels, "
           f"{data['trials_per_kernel']} trials each; the sum of the kernels' times x launches "
           f"as the kernels are searched, each at its best candidate or its seed; `tvmfuse`: the "
           f"rules' design spaces, `generic` or `scratch`: MetaSchedule's generic space):", ""]
    out += table(["start", "model ms at trial 0", f"at trial {data['trials_per_kernel']}",
                  "reaches 90% of final at trial"], rows)
    return out + [""] + provenance(kind, [data])


def tune_gain_table(kind: str, data: dict) -> list[str]:
    """`benchmarks/tune_gain.py`: each model tuned within a budget, then benched beside its
    untuned build and ONNX Runtime."""
    rows = []
    for run in data["tune_gain"]:
        kernels = run["kernels"]
        recorded = sum(k["recorded"] for k in kernels)
        by = engines(run.get("bench", {}))
        tuned, untuned = by.get("tvmfuse", {}), by.get("tvmfuse-untuned", {})
        ort = by.get("onnxruntime", {})
        rows.append([run["model"], f"{run['tune_s'] / 60:.0f} min",
                     f"{recorded} of {len(kernels)}",
                     ms(untuned.get("median_ms")), ms(tuned.get("median_ms")),
                     ratio(tuned.get("median_ms"), untuned.get("median_ms"), 0.9),
                     ms(ort.get("median_ms")),
                     ratio(tuned.get("median_ms"), ort.get("median_ms"), 0.8)])
    out = ["**What tuning gains** (`tvmfuse tune` of the rules' design spaces within a budget, "
           "into a fresh database; then `tvmfuse bench` of the tuned and untuned builds beside "
           "ONNX Runtime, fp32, batch 1, medians; a searched kernel is recorded only where it beat "
           "its schedule by more than the spread when both were timed again, alternately):", ""]
    out += table(["model", "tuning", "searched kernels recorded", "untuned ms", "tuned ms",
                  "tuned / untuned", "ONNX Runtime ms", "tuned / ONNX Runtime"], rows)
    return out + [""] + provenance(kind, [data])


#: How the build-time table groups a manifest's stages (tvmfuse/buildtime.py's STAGES).
BUILD_STAGES = (("startup", ("startup",)), ("import", ("import",)), ("reuse check", ("reuse",)),
                ("passes", ("fold", "canonicalize", "fuse_patterns", "legalize", "fuse_ops",
                            "verify_fusion", "fuse_tir", "prepack", "lower", "analysis")),
                ("scheduling", ("database", "apply_database", "schedule")),
                ("TIR lowering", ("tir_lower",)), ("codegen", ("codegen",)),
                ("CUDA compile", ("cuda_compile",)), ("export", ("export", "reference")))


def build_time_table(kind: str, data: dict) -> list[str]:
    """`benchmarks/build_time.py`: each model built cold, then rebuilt unchanged."""
    rows = []
    for build in data["build_time"]:
        if "error" in build:
            rows.append([build["model"], build["run"], _cell(build["error"])] +
                        [""] * len(BUILD_STAGES))
            continue
        stages = build["stages"]
        run = f"{build['run']}, kept" if build.get("kept") else build["run"]
        rows.append([build["model"], run, f"{build['wall_s']:.1f}"] +
                     [f"{sum(stages.get(s, 0.0) for s in group):.1f}"
                      for _, group in BUILD_STAGES])
    out = [f"**Build time** (`tvmfuse build --no-db`, {data['dtype']}, target {data['target']}, "
           f"{data['cores']} cores; seconds: the process's wall time, then the build's stages; "
           "`rebuilt`: the same build again, unchanged, into the same folder, with the kernel "
           "cache the first filled; `kept`: tvmfuse kept the folder, its build unchanged):",
           ""]
    out += table(["model", "run", "wall s", *(label for label, _ in BUILD_STAGES)], rows,
                 right_from=2)
    return out + [""] + provenance(kind, [data])


def per_layer_table(kind: str, data: dict) -> list[str]:
    row = [data["model"], ms(data["tvmfuse_ms"]), ms(data["tvmfuse_in_place_ms"]),
           ms(data["onnxruntime_ms"])]
    out = [f"**Per-layer times** ({data['model']}; every kernel timed alone, summed):", ""]
    out += table(["model", "tvmfuse kernels alone ms", "kernels in place ms",
                  "ONNX Runtime ms"], [row])
    return out + [""] + provenance(kind, [data])


def inspect_table(kind: str, data: dict) -> list[str]:
    rows = []
    for model, counts in data["inspect"].items():
        rows.append([model, *(str(counts[k]) for k in ("unfused", "stock", "tvmfuse")),
                     *(f"{counts[k + '_mb']:.1f}" for k in ("unfused", "stock", "tvmfuse"))])
    out = ["**Kernels and bytes moved** (`tvmfuse inspect`: every op its own kernel, TVM's "
           "stock FuseOps, tvmfuse; bytes = each kernel's inputs read and outputs written once):",
           ""]
    out += table(["model", "unfused kernels", "stock FuseOps", "tvmfuse", "unfused MB",
                  "stock MB", "tvmfuse MB"], rows)
    return out + [""] + provenance(kind, [data])


def kernels_table(kind: str, reports: list[dict]) -> list[str]:
    rows = []
    for report in reports:
        by = {r["engine"]: r for r in report["results"]}
        rows.append([zoo_label(report),
                     *(str(by.get(e, {}).get("kernels") or "-")
                       for e in ("tvmfuse", "tvmfuse-unfused", "stock-tvm")),
                     ms(by.get("tvmfuse", {}).get("median_ms")),
                     ms(by.get("tvmfuse-unfused", {}).get("median_ms"))])
    out = ["**Kernel counts** (the bench's builds: tvmfuse, tvmfuse's pipeline with its fusion "
           "rules off, stock TVM):", ""]
    out += table(["model", "tvmfuse kernels", "unfused kernels", "stock TVM kernels",
                  "tvmfuse ms", "unfused ms"], rows)
    return out + [""] + provenance(kind, reports)


def gpu_section(kind: str, files: dict[str, dict]) -> list[str]:
    precision = ["float16", "bfloat16", "float32"]
    reports = sorted(zoo_files(files), key=lambda d: (precision.index(d["dtype"]),
                                                      model_name(d), d["batch"]))
    out = [f"## {MACHINES.get(kind, kind)} (`{kind}`)", ""]
    if reports:
        out += ["**Whole models on the GPU** (`tvmfuse bench --target cuda-sm90 --no-db`, CUDA "
                "events, medians; fp32 is strict, TF32 off):", ""]
        out += bench_table(reports, "model, precision, batch", zoo_label) + [""]
        out += provenance(kind, reports)
    for name, section in (("build-time", build_time_table), ("coverage", coverage_table)):
        if name in files:
            out += ([""] if out[-1] else []) + section(kind, files[name])
    return out


def is_gpu(files: dict[str, dict]) -> bool:
    return any(str(d.get("target", "")).startswith("cuda") for d in files.values())


def benchmarks_md(kinds: dict[str, dict[str, dict]]) -> str:
    out = ["# Benchmarks", "", *INTRO.strip("\n").split("\n"), ""]
    for kind in sorted(kinds, key=kind_order):
        files = kinds[kind]
        out += gpu_section(kind, files) if is_gpu(files) else cpu_section(kind, files)
    while out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


def standings(kinds: dict[str, dict[str, dict]]) -> str:
    """README's block: per machine kind, tvmfuse against its best peer on the headline models."""
    out = [BEGIN, "", "Written by `python benchmarks/report.py` from `benchmarks/results/`; "
           "details in [BENCHMARKS.md](BENCHMARKS.md).", ""]
    for kind in sorted(kinds, key=kind_order):
        files = kinds[kind]
        rows = []
        for report in zoo_files(files):
            best = best_peer(report)
            ours = engines(report).get("tvmfuse")
            headline = (report["dtype"] == "float16" and model_name(report) in HEADLINE_GPU
                        if is_gpu(files) else report["dtype"] == "float32")
            if headline:
                if best and ours:
                    rows.append([zoo_label(report), ms(ours["median_ms"]),
                                 peer_label(best[0], [report]), ms(best[1]),
                                 ratio(ours["median_ms"], best[1])])
        for name, (_, label) in MODEL_SETS.items():
            if name in files:
                runs = [r for r in files[name]["runs"] if "tvmfuse" in engines(r) and
                        best_peer(r)]
                ratios = set_ratios(runs)
                text = f"{geomean(ratios):.2f}x"
                rows.append([label, "-", " or ".join(peer_label(p, runs) for p in peers_of(runs)),
                             "-",
                             f"**{text}**" if geomean(ratios) < 1 else text])
        if rows:
            out += [f"**{MACHINES.get(kind, kind)}**", ""]
            out += table(["model", "tvmfuse ms", "best peer", "peer ms", "ratio"], rows,
                         right_from=1) + [""]
    return "\n".join(out + [END])


def with_standings(readme: str, block: str) -> str | None:
    """README.md's text with its standings block replaced; None when it has no markers."""
    lines = readme.split("\n")
    if BEGIN not in lines or END not in lines:
        return None
    start, end = lines.index(BEGIN), lines.index(END)
    if end < start:
        return None
    return "\n".join(lines[:start] + block.split("\n") + lines[end + 1:])


def summary(path: Path, want: str, have: str) -> str:
    diff = [d for d in difflib.unified_diff(have.splitlines(), want.splitlines(), lineterm="",
                                            n=0) if d[:1] in "+-" and d[:3] not in ("+++", "---")]
    first = next((d for d in difflib.unified_diff(have.splitlines(), want.splitlines(),
                                                  lineterm="", n=0) if d.startswith("@@")), "")
    return (f"{path.name} is not what benchmarks/report.py makes of benchmarks/results/ "
            f"({len(diff)} lines differ, first hunk {first.strip('@ ')}): run "
            f"`python benchmarks/report.py` and commit the result")


def commit() -> str:
    """The checkout's commit (git's short HEAD) that results are measured at; the benchmark
    scripts name it in their JSON."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True)
    return done.stdout.strip() or "unknown"


def file_report(path: Path) -> None:
    """Name the machine kind (``path``'s folder), the commit (HEAD) and the command in the
    ``tvmfuse bench --json`` report at ``path``, measured at this checkout."""
    data = json.loads(path.read_text())
    stamped = {"machine": path.parent.name, "commit": commit(), "commit_is": "measured",
               "reproduce": "python -m " + data["command"]}
    path.write_text(json.dumps({**stamped, **{k: v for k, v in data.items()
                                              if k not in stamped}}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a file differs from what it would be")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--out", type=Path, default=REPO / "BENCHMARKS.md")
    parser.add_argument("--readme", type=Path, default=REPO / "README.md",
                        help="README to fill between the standings markers, if it has them")
    parser.add_argument("--file", type=Path, nargs="+", metavar="REPORT",
                        help="first name the machine, commit and command in these new reports")
    args = parser.parse_args(argv)
    for path in args.file or ():
        file_report(path)
    kinds = load(args.results)
    wanted = {args.out: benchmarks_md(kinds)}
    if args.readme.exists():
        readme = with_standings(args.readme.read_text(), standings(kinds))
        if readme is not None:
            wanted[args.readme] = readme
    stale = 0
    for path, want in wanted.items():
        have = path.read_text() if path.exists() else ""
        if have == want:
            continue
        if args.check:
            print(summary(path, want, have))
            stale += 1
        else:
            path.write_text(want)
            print(f"wrote {path}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
