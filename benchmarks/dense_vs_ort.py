"""How close a GEMM gets to this CPU's limit: in interleaved rounds, the FMA-only kernel of
``tvmfuse bench --peak`` (:mod:`tvmfuse.bench.peak`), tvmfuse's dense kernel for a linear layer
(:func:`kernel_bench.dense_kernels`, untuned) and ONNX Runtime's MatMul + Add on the same shape,
both on two threads; GFLOP/s of the fastest round of each (this machine's rates drift by a third
between seconds; compare within one run only).

    .venv/bin/python benchmarks/dense_vs_ort.py --shapes 197,3072,768;197,768,3072 [--rounds 5]

A shape is ``M,K,N`` (rows, reduction, columns).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TVM_BIND_THREADS", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import tvm  # noqa: E402

import kernel_bench  # noqa: E402
from tvmfuse.bench.peak import measure_peak_gflops  # noqa: E402
from tvmfuse.targets import get_target  # noqa: E402


def ort_session(m: int, k: int, n: int, threads: int):
    """ONNX Runtime's session of ``x [1, m, k] @ w + b`` and its input."""
    import onnx  # noqa: PLC0415
    import onnxruntime as ort  # noqa: PLC0415
    from onnx import TensorProto, helper  # noqa: PLC0415

    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n)).astype("float32")
    b = rng.standard_normal(n).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"])],
        "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, m, n])],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")])
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(helper.make_model(graph).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session, {"x": rng.standard_normal((1, m, k)).astype("float32")}


def fastest_run(run, repeats: int = 15) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="197,3072,768;197,768,3072;197,768,768")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    target = get_target()  # this machine's: what `tvmfuse build` takes without --target
    threads = int(target.config.get("num-cores", 2))
    for shape in args.shapes.split(";"):
        m, k, n = (int(v) for v in shape.split(","))
        (_, flops, library, name, inputs), = kernel_bench.dense_kernels([n], m, target, depth=k)
        timer = library.time_evaluator(name, tvm.cpu(), number=5, repeat=3)
        session, feed = ort_session(m, k, n, threads)
        best = {"FMA peak": 0.0, "tvmfuse": 0.0, "ONNX Runtime": 0.0}
        for _ in range(args.rounds):
            best["FMA peak"] = max(best["FMA peak"], measure_peak_gflops(target, threads))
            best["tvmfuse"] = max(best["tvmfuse"], flops / min(timer(*inputs).results) / 1e9)
            best["ONNX Runtime"] = max(best["ONNX Runtime"], 2 * m * k * n / fastest_run(
                lambda: session.run(None, feed)) / 1e9)
        print(f"{m}x{k}x{n}: " + ", ".join(f"{key} {value:.1f}" for key, value in best.items())
              + " GFLOP/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
