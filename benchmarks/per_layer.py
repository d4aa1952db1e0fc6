"""Per-layer time of tvmfuse next to ONNX Runtime's, in one process: where the end-to-end gap is.

    python benchmarks/per_layer.py resnet50 --json benchmarks/resnet50-per-layer.json

tvmfuse's kernels are timed alone as ``tvmfuse inspect --profile`` does (each distinct kernel on
random arguments, times its launches); ONNX Runtime's nodes by its own profiler (``kernel_time``
of every node over ``runs`` runs of the model, median per node), with the same two threads. The
two lists do not pair one to one (ONNX Runtime's graph has its own fusions and NCHWc layout), so
the report gives each side's total and its slowest entries; the JSON has them all.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tvmfuse import api, engines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()

    target = api.get_target("avx512")
    model = api.import_model(args.model)
    ours = api.profile_kernels(model, target, api.BuildOptions())
    theirs = _onnxruntime_nodes(model, int(target.config["num-cores"]), args.runs)
    report = {"model": args.model, "tvmfuse_ms": sum(k["ms"] for k in ours),
              "onnxruntime_ms": sum(n["ms"] for n in theirs), "tvmfuse": ours,
              "onnxruntime": theirs}
    args.json.write_text(json.dumps(report, indent=1))
    print(f"sum of kernels: tvmfuse {report['tvmfuse_ms']:.2f} ms ({len(ours)} distinct kernels), "
          f"ONNX Runtime {report['onnxruntime_ms']:.2f} ms ({len(theirs)} nodes)")
    for side in ("tvmfuse", "onnxruntime"):
        print(f"slowest of {side}:")
        for entry in report[side][:args.top]:
            name = entry.get("kernel") or entry["node"]
            print(f"  {entry['ms']:7.3f} ms  {name[-70:]}")


def _onnxruntime_nodes(model, threads: int, runs: int) -> list[dict]:
    """Median time per run of each ONNX Runtime node (ms), slowest first."""
    with tempfile.TemporaryDirectory(prefix="per-layer-") as folder:
        # exported as `tvmfuse bench` exports it for its onnxruntime engine
        path = engines.export_onnx(engines.BenchContext(
            model=model, target=api.get_target("avx512"), inputs=model.example_inputs,
            threads=threads, build_options=None, torch_module=model.torch_module,
            onnx_path=None))
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "profile")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        feed = {i.name: np.asarray(a) for i, a in zip(session.get_inputs(), model.example_inputs)}
        for _ in range(runs):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    times = collections.defaultdict(list)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            key = (event["name"][:-len("_kernel_time")], event["args"].get("op_name", ""))
            times[key].append(event["dur"] / 1e3)
    nodes = [{"node": name, "op": op, "ms": statistics.median(durations)}
             for (name, op), durations in times.items()]
    return sorted(nodes, key=lambda n: -n["ms"])


if __name__ == "__main__":
    main()
