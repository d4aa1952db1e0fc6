"""Per-layer time of tvmfuse next to ONNX Runtime's, in one process: where the end-to-end gap is.

    python benchmarks/per_layer.py resnet50 --json benchmarks/resnet50-per-layer.json

tvmfuse's kernels are timed alone as ``tvmfuse inspect --profile`` does (each distinct kernel on
random arguments, times its launches) and in place (``in_place_ms``: each launch timed by the VM's
instrument hook during ``runs`` runs of the model, median per launch, summed per kernel: what the
kernel takes on the data and caches the model leaves it); ONNX Runtime's nodes by its own
profiler (``kernel_time`` of every node over ``runs`` runs of the model, median per node, which is
in place too), with the same two threads. The two lists do not pair one to one (ONNX Runtime's
graph has its own fusions and NCHWc layout), so the report gives each side's total and its
slowest entries; the JSON has them all.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tvmfuse import api
from tvmfuse.bench import engines
from tvmfuse.bench.engines.ort import export_onnx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()

    target = api.get_target()
    model = api.import_model(args.model)
    ours = api.profile_kernels(model, target, api.BuildOptions())
    in_place = _in_place(model, target, args.runs)
    for kernel in ours:
        kernel["in_place_ms"] = round(in_place.pop(kernel["kernel"], 0.0), 4)
    theirs = _onnxruntime_nodes(model, int(target.config["num-cores"]), args.runs)
    report = {"model": args.model, "tvmfuse_ms": sum(k["ms"] for k in ours),
              "tvmfuse_in_place_ms": sum(k["in_place_ms"] for k in ours),
              "vm_builtins_in_place_ms": sum(in_place.values()),
              "onnxruntime_ms": sum(n["ms"] for n in theirs), "tvmfuse": ours,
              "onnxruntime": theirs}
    args.json.write_text(json.dumps(report, indent=1))
    print(f"sum of kernels: tvmfuse {report['tvmfuse_ms']:.2f} ms alone, "
          f"{report['tvmfuse_in_place_ms']:.2f} ms in place ({len(ours)} distinct kernels; VM "
          f"builtins {report['vm_builtins_in_place_ms']:.2f} ms), "
          f"ONNX Runtime {report['onnxruntime_ms']:.2f} ms ({len(theirs)} nodes)")
    for side in ("tvmfuse", "onnxruntime"):
        print(f"slowest of {side}:")
        for entry in report[side][:args.top]:
            name = entry.get("kernel") or entry["node"]
            in_place = f" ({entry['in_place_ms']:.3f} in place)" if "in_place_ms" in entry else ""
            print(f"  {entry['ms']:7.3f} ms{in_place}  {name[-70:]}")


def _in_place(model, target, runs: int) -> dict[str, float]:
    """Kernel (or VM builtin) -> its launches' milliseconds per run of the whole model, each
    launch timed by the VM's instrument hook (0.27's VM has no ``profile=True``); median over
    ``runs`` runs per launch."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    compiled = api.compile_model(model, target, api.BuildOptions())
    device = tvm.cpu()
    vm = relax.VirtualMachine(compiled.executable, device)
    inputs = [tvm.runtime.tensor(np.asarray(x), device) for x in model.example_inputs]
    launches: list[tuple[str, float]] = []
    started = []

    def instrument(_func, name, before_run, _result, *_args):
        if before_run:
            started.append(time.perf_counter())
        else:
            launches.append((name, time.perf_counter() - started.pop()))

    for _ in range(3):
        vm["main"](*inputs)
    vm.set_instrument(instrument)
    per_run = []
    for _ in range(runs):
        launches.clear()
        vm["main"](*inputs)
        per_run.append(list(launches))
    totals = collections.Counter()
    for i, (name, _) in enumerate(per_run[0]):
        totals[name] += statistics.median(run[i][1] for run in per_run) * 1e3
    return dict(totals)


def _onnxruntime_nodes(model, threads: int, runs: int) -> list[dict]:
    """Median time per run of each ONNX Runtime node (ms), slowest first."""
    with tempfile.TemporaryDirectory(prefix="per-layer-") as folder:
        # exported as `tvmfuse bench` exports it for its onnxruntime engine
        path = export_onnx(engines.BenchContext(
            model=model, target=api.get_target(), inputs=model.example_inputs,
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
