"""The bench harness on a tiny model: statistics, interleaving, skipping, the JSON schema.
No assertion here is about how fast anything is."""

import json
import sys

import pytest
import tvm

from tvmfuse import TvmfuseError, api
from tvmfuse.bench import measure, peak
from tvmfuse.bench.report import Report, Result
from tvmfuse.verify import relative_error

from conftest import HOST, run_cli


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_measure_interleaves_and_computes_statistics(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(measure.time, "perf_counter", clock)
    order = []
    # each timed run follows an untimed one (the settle run) of the same engine
    costs = {"a": iter([0.5] + [x for t in (0.001, 0.003, 0.002, 0.010) for x in (0.2, t)]),
             "b": iter([0.5] + [0.2, 0.004] * 4)}

    def engine(name):
        def run():
            order.append(name)
            clock.now += next(costs[name])
        return run

    a, b = measure.measure({"a": engine("a"), "b": engine("b")}, repeat=4)
    # warm-up each, then interleaved rounds of a settle run and a timed run per engine
    assert order == ["a", "b"] + ["a", "a", "b", "b"] * 4
    assert a.times_ms == pytest.approx((1.0, 3.0, 2.0, 10.0))
    assert (a.median_ms, a.min_ms, a.max_ms) == pytest.approx((2.5, 1.0, 10.0))
    assert b.median_ms == pytest.approx(4.0)


def test_measure_caps_slow_engines_but_runs_them_at_least_three_times(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(measure.time, "perf_counter", clock)

    def engine(seconds):
        def run():
            clock.now += seconds
        return run

    fast, slow = measure.measure({"fast": engine(0.01), "slow": engine(5.0)}, repeat=10,
                               max_seconds=2.0)
    assert len(fast.times_ms) == 10
    assert len(slow.times_ms) == measure.MIN_RUNS


def test_report_ratios_compare_with_the_best_peer_not_tvmfuse():
    report = Report("m", "avx512", 2, 1, "float32", flops=2e9, peak_gflops=100.0)
    for engine, ms in (("tvmfuse", 10.0), ("torch-eager", 40.0), ("onnxruntime", 20.0)):
        report.results.append(Result(engine, ms, ms, ms, 3, 0.0, 0.0, None))
    report.finish()
    ratios = {r.engine: r.ratio_to_best_peer for r in report.results}
    assert ratios == {"tvmfuse": 0.5, "torch-eager": 2.0, "onnxruntime": 1.0}
    tvmfuse = report.results[0]
    assert tvmfuse.gflops == pytest.approx(200.0)
    assert tvmfuse.fraction_of_peak == pytest.approx(2.0)


def test_the_cpu_peak_is_a_loop_of_vector_fmas_on_every_thread():
    """--peak times a kernel of nothing but FMAs on the target's widest vectors (zmm on
    AVX-512, ymm on AVX2), independent accumulators that leave four registers free (16 of
    AVX-512's 32, 12 of AVX2's 16), one parallel iteration per thread."""
    import numpy as np

    target = api.get_target(HOST)
    library, (b, acc) = peak.fma_loop(target, threads=2, steps=100)
    assembly = library.inspect_source("asm")
    register = {16: "zmm", 8: "ymm", 4: "xmm"}[target.vector.lanes]
    assert "vfmadd" in assembly and register in assembly
    chains = min(16, target.vector.registers - 4)
    assert b.shape == acc.shape == (2, chains, target.vector.lanes)
    library["main"](b, acc)
    expected = sum(1e-3 * 0.999**k for k in range(100))  # acc = acc * 0.999 + b, 100 times
    np.testing.assert_allclose(acc.numpy(), expected, rtol=1e-5)


def test_the_bf16_peak_is_a_loop_of_pair_dot_products():
    """On a CPU with AVX-512 BF16, --peak in bf16 times ``vdpbf16ps`` (the instruction of a bf16
    build's GEMMs), each step adding 1 * 1 + 1 * 1 to every lane of every accumulator."""
    import numpy as np

    target = api.get_target(HOST)
    if target.vector is None or not target.vector.dot_bf16:
        pytest.skip(f"{target.name} has no AVX-512 BF16")
    library, (start, end) = peak.dot_loop(target, threads=2, steps=100)
    assert library.inspect_source("asm").count("vdpbf16ps") >= start.shape[1]
    library["main"](start, end)
    np.testing.assert_array_equal(end.numpy(), 200.0)


def test_bench_skips_a_missing_engine_and_checks_every_output(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    model = api.import_model("tiny-mobilenet")
    report = api.bench(model, api.get_target(HOST),
                       ["tvmfuse", "tvmfuse-unfused", "stock-tvm", "torch-eager", "onnxruntime"],
                       options=api.BuildOptions(), threads=1, repeat=3, max_seconds=5, peak=False)
    assert set(report.skipped) == {"onnxruntime"}
    assert "not installed" in report.skipped["onnxruntime"]
    by_engine = {r.engine: r for r in report.results}
    assert set(by_engine) == {"tvmfuse", "tvmfuse-unfused", "stock-tvm", "torch-eager"}
    for r in report.results:
        assert r.runs == 3 and r.min_ms <= r.median_ms <= r.max_ms
        assert r.rel_err is not None and r.rel_err <= 1e-4
    assert by_engine["tvmfuse"].kernels < by_engine["stock-tvm"].kernels
    # fusion alone: with tvmfuse's rules off only TVM's FuseOps groups ops: more kernels
    assert by_engine["tvmfuse"].kernels < by_engine["tvmfuse-unfused"].kernels
    # the ratio is to the best peer: tvmfuse's own engines are not peers
    best_peer = min(by_engine[e].median_ms for e in ("stock-tvm", "torch-eager"))
    assert by_engine["tvmfuse-unfused"].ratio_to_best_peer == pytest.approx(
        by_engine["tvmfuse-unfused"].median_ms / best_peer)
    assert report.flops > 0


def _failing_engines(monkeypatch):
    """torch-compile fails to prepare (an Inductor error), torch-compile-freezing runs twice
    and then fails (as CUDA graphs did at a replay)."""
    from tvmfuse.bench import engines

    def fail_to_prepare(ctx):
        raise RuntimeError("storage data ptrs are not allocated in pool\nsecond line")

    def fail_on_third_run(ctx):
        calls = []

        def run():
            calls.append(1)
            if len(calls) > 2:
                raise RuntimeError("replay failed")

        return engines.Engine("torch-compile-freezing", run, lambda: [], 0.0)

    monkeypatch.setitem(engines._PREPARE, "torch-compile", fail_to_prepare)
    monkeypatch.setitem(engines._PREPARE, "torch-compile-freezing", fail_on_third_run)


def test_bench_skips_a_peer_that_fails_with_one_line(monkeypatch, caplog):
    _failing_engines(monkeypatch)
    model = api.import_model("tiny-mobilenet")
    with caplog.at_level("WARNING", logger="tvmfuse.bench.session"):
        report = api.bench(model, api.get_target(HOST),
                           ["tvmfuse", "torch-eager", "torch-compile", "torch-compile-freezing"],
                           options=api.BuildOptions(), threads=1, repeat=3, max_seconds=5,
                           peak=False)
    assert report.skipped == {
        "torch-compile": "failed to prepare: RuntimeError: storage data ptrs are not allocated "
                         "in pool",
        "torch-compile-freezing": "failed to run: RuntimeError: replay failed"}
    # the others are timed and checked in full
    assert {r.engine for r in report.results} == {"tvmfuse", "torch-eager"}
    assert all(r.runs == 3 and r.rel_err <= 1e-4 for r in report.results)
    warnings = [r.getMessage() for r in caplog.records
                if r.levelname == "WARNING" and r.name == "tvmfuse.bench.session"]
    assert warnings == [f"skipping {name}: {why}" for name, why in report.skipped.items()]


def test_bench_raises_when_tvmfuse_itself_fails(monkeypatch):
    from tvmfuse.bench import engines

    def fail(ctx):
        raise RuntimeError("tvmfuse broke")

    monkeypatch.setitem(engines._PREPARE, "tvmfuse", fail)
    model = api.import_model("tiny-mobilenet")
    with pytest.raises(RuntimeError, match="tvmfuse broke"):
        api.bench(model, api.get_target(HOST), ["tvmfuse", "torch-eager"],
                  options=api.BuildOptions(), threads=1, repeat=3, max_seconds=5, peak=False)


def test_unknown_engine_is_an_error():
    from tvmfuse.bench.engines import check_names

    with pytest.raises(TvmfuseError, match="unknown engine 'tensorrt'"):
        check_names(["tvmfuse", "tensorrt"])


def test_bench_cli_writes_json_and_png(tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    result = run_cli("bench", "tiny-resnet", "--engines", "tvmfuse,torch-eager,onnxruntime",
                     "--repeat", "3", "--threads", "1", "--json", str(out), "--plot", str(png))
    assert result.returncode == 0, result.stderr
    assert f"tiny-resnet on {HOST}" in result.stdout
    report = json.loads(out.read_text())
    assert report["command"].startswith("tvmfuse bench tiny-resnet")
    assert {r["engine"] for r in report["results"]} == {"tvmfuse", "torch-eager", "onnxruntime"}
    for r in report["results"]:
        assert {"engine", "median_ms", "min_ms", "max_ms", "rel_err"} <= set(r)
        assert r["rel_err"] <= 1e-4
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_engine_computes_in_the_bench_precision():
    model = api.import_model("tiny-resnet")
    target = api.get_target(HOST)
    half = api.bench(model, target, ["tvmfuse", "stock-tvm", "torch-eager", "onnxruntime"],
                     options=api.BuildOptions(), threads=1, repeat=3, max_seconds=5, peak=False,
                     dtype="float16")
    assert half.dtype == "float16" and not half.skipped
    # float16 against the float32 reference: visibly less exact than float32, within fp16's reach
    for r in half.results:
        assert 1e-6 < r.rel_err < 1e-2, r
    bf16 = api.bench(model, target, ["tvmfuse", "stock-tvm", "torch-eager", "onnxruntime"],
                     options=api.BuildOptions(), threads=1, repeat=3, max_seconds=5, peak=False,
                     dtype="bfloat16")
    # tvmfuse narrows to bfloat16 itself; stock TVM's ToMixedPrecision cannot, nor ORT's CPU
    assert "float16 only" in bf16.skipped["stock-tvm"] and "bfloat16" in bf16.skipped["onnxruntime"]
    for r in bf16.results:  # tvmfuse and PyTorch: bfloat16's 8 bits, less exact than float16's 11
        assert 1e-4 < r.rel_err < 5e-2, r


def test_float16_builds_fold_batch_norm_before_the_precision_casts():
    model = api.import_model("tiny-resnet")
    mod, analysis = api.analyze(model, api.get_target(HOST), api.BuildOptions(dtype="float16"))
    ops = {op for g in analysis.groups for op in g.ops}
    assert "conv2d" in ops and not {"subtract", "divide"} & ops  # BatchNorm folded
    dtypes = {str(p.ty.dtype) for f in mod.functions.values() if hasattr(f, "params")
              for p in f.params if hasattr(p.ty, "dtype")}
    assert "float16" in dtypes
    with pytest.raises(TvmfuseError, match="not float64"):
        api.analyze(model, api.get_target(HOST), api.BuildOptions(dtype="float64"))


def test_float16_builds_take_relu6():
    """ToMixedPrecision cannot type clip's scalar bounds (it raised on MobileNetV2's ReLU6):
    the clips are decomposed before it, and still end in their convs' kernels."""
    model = api.import_model("tiny-mobilenet")
    _, analysis = api.analyze(model, api.get_target(HOST), api.BuildOptions(dtype="float16"))
    ops = [op for g in analysis.groups for op in g.ops]
    assert "clip" not in ops and "minimum" in ops
    assert all(g.ops.index("conv2d") < g.ops.index("minimum")
               for g in analysis.groups if "minimum" in g.ops)


def test_stock_tvm_applies_the_same_tuning_database(tmp_path):
    """Seed a database with the stock pipeline's own kernels; the stock pipeline then builds
    them with those records (each record's trace annotates the kernel with its rule)."""
    import torch
    import tvm
    from tvm import relax

    from tvmfuse import pipeline, strategy
    from tvmfuse.names import SCHEDULE as SCHEDULE_ATTR
    from tvmfuse.tuning.tune import tune

    model = api.import_torch(torch.nn.Linear(64, 32).eval(), [torch.randn(4, 64)])
    spec = api.get_target(HOST)
    target = spec.tvm_target()
    with target:
        fused = tvm.transform.Sequential([
            relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR(),
        ])(model.mod)
        tune(fused, target, tmp_path, trials=0, scheduler=strategy.scheduler(spec),
             tir_pipeline=strategy.for_target(spec).tir_pipeline(), progress=False)

    def annotated(database):
        mod = pipeline.stock(target, database)(model.mod)
        return [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)
                and SCHEDULE_ATTR in f.script()]

    assert annotated(tmp_path) and not annotated(None)


# the CUDA case imports TVM's CUDA intrinsics (80 s on 2 cores) in a second test worker; the
# default run builds fp16 CUDA kernels in tests/schedules/test_cuda_*.py
@pytest.mark.parametrize("target", [HOST, pytest.param("cuda-sm90", marks=pytest.mark.slow)])
def test_float16_transformers_build_with_attention_fused(target, tmp_path):
    """ToMixedPrecision has no policy for call_tir: run after FuseAttention it asked the dtype
    of the kernel itself ("Expected TensorType, but got R.Callable") and no fp16 transformer
    built. It runs first now, and FuseAttention takes the chain it leaves (float16 Q, K, V;
    the softmax in float32 between casts; a float32 mask)."""
    model = api.import_model("tiny-transformer")
    compiled = api.compile_model(model, api.get_target(target),
                                 api.BuildOptions(use_database=False, dtype="float16"))
    assert "tvmfuse.fused_attention" in {g.rule for g in compiled.analysis.groups}
    if target != HOST:
        return  # the CUDA build's numbers are checked on the GPU host
    deployed = api.load(api.build(compiled, tmp_path / "out"))
    (out,) = deployed.run(model.example_inputs)
    (ref,) = model.reference(*model.example_inputs)
    # computed in float16 (visibly less exact than float32), within its reach of PyTorch fp32
    assert 1e-6 < relative_error(out, ref) < 1e-2


@pytest.mark.skipif(not tvm.cuda(0).exist, reason="needs a CUDA GPU (run on the GPU host)")
def test_a_gpu_bench_leaves_the_model_on_the_cpu():
    """The GPU bench moves a copy of the module to the GPU: the model's reference (CPU inputs)
    still runs, and a second bench of the same model (another precision) works."""
    from tvmfuse.bench.session import bench  # noqa: PLC0415

    model = api.import_model("tiny-transformer")
    for dtype in ("float16", "bfloat16"):
        report = bench(model, api.get_target("cuda-sm90"), ["tvmfuse", "torch-eager"],
                       options=api.BuildOptions(use_database=False, dtype=dtype), threads=1,
                       repeat=2, max_seconds=2, peak=False, dtype=dtype)
        assert not report.skipped and all(r.rel_err < 1e-2 for r in report.results)
    model.reference(*model.example_inputs)
