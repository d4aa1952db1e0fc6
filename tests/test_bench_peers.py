"""The peers of `tvmfuse bench` with a framework or a precision of their own: OpenVINO (the
precision it picks, and float32) and ONNX Runtime's static int8, run on tiny zoo models; how a
peer that is absent or fails is skipped. No assertion here is about how fast anything is."""

import logging
import sys
from pathlib import Path

import pytest

from tvmfuse import TvmfuseError, api
from tvmfuse.bench import engines

from conftest import HOST

PEERS = ["onnxruntime-int8", "openvino", "openvino-fp32"]


def bench(model: str, names: list[str]):
    return api.bench(api.import_model(model), api.get_target(HOST), names,
                     options=api.BuildOptions(), threads=1, repeat=2, max_seconds=5, peak=False)


def skip_lines(caplog, engine: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(f"skipping {engine}:")]


def test_the_peers_are_engines_bench_selects():
    assert set(PEERS) <= set(engines.ENGINES)
    # prepared after the float32 ONNX Runtime, whose export they read
    assert engines.ENGINES.index("onnxruntime") < min(engines.ENGINES.index(p) for p in PEERS)
    assert engines.check_names(["tvmfuse", *PEERS]) == ["tvmfuse", *PEERS]
    with pytest.raises(TvmfuseError, match="unknown engine 'openvino-int8'"):
        engines.check_names(["openvino", "openvino-int8"])


def test_a_missing_openvino_is_skipped_with_one_line(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "openvino", None)  # as if not installed
    with caplog.at_level(logging.INFO):
        report = bench("tiny-resnet", ["torch-eager", "openvino", "openvino-fp32"])
    assert [r.engine for r in report.results] == ["torch-eager"]
    for name in ("openvino", "openvino-fp32"):
        why = "openvino is not installed (pip install 'tvmfuse[openvino]')"
        assert report.skipped[name] == why
        (line,) = skip_lines(caplog, name)
        assert line.getMessage() == f"skipping {name}: {why}" and line.exc_info is None


def test_a_peer_that_fails_is_skipped_with_one_line_naming_its_error(monkeypatch, caplog):
    from onnxruntime import quantization

    def quantize_static(*args, **kwargs):
        raise ValueError("no tensor to calibrate\nTraceback (most recent call last): ...")

    monkeypatch.setattr(quantization, "quantize_static", quantize_static)
    # a peer that prepares but fails on its first run
    broken = engines.Engine("onnxruntime", lambda: None, lambda: [1 / 0], 0.0)
    monkeypatch.setitem(engines._PREPARE, "onnxruntime", lambda ctx: broken)
    with caplog.at_level(logging.INFO):
        report = bench("tiny-resnet", ["torch-eager", "onnxruntime", "onnxruntime-int8"])
    assert [r.engine for r in report.results] == ["torch-eager"]
    assert report.skipped == {
        "onnxruntime": "failed to prepare: ZeroDivisionError: division by zero",
        "onnxruntime-int8": "ONNX Runtime's static quantization failed: no tensor to calibrate",
    }
    for name in report.skipped:
        (line,) = skip_lines(caplog, name)
        assert line.exc_info is None and "\n" not in line.getMessage()


def test_tvmfuse_failing_is_not_skipped_as_a_peer_would_be(monkeypatch):
    def fails(ctx):
        raise RuntimeError("a bug in tvmfuse")

    monkeypatch.setitem(engines._PREPARE, "tvmfuse", fails)
    with pytest.raises(RuntimeError, match="a bug in tvmfuse"):
        bench("tiny-resnet", ["tvmfuse", "torch-eager"])


def test_the_peers_run_a_classifier_close_to_pytorch_float32():
    report = bench("tiny-resnet", ["torch-eager", *PEERS])
    assert not report.skipped
    by = {r.engine: r for r in report.results}
    fp32, picked, int8 = by["openvino-fp32"], by["openvino"], by["onnxruntime-int8"]
    assert fp32.precision == "float32" and fp32.rel_err < 1e-4
    if "avx512_bf16" in Path("/proc/cpuinfo").read_text():  # what OpenVINO picks there
        assert picked.precision == "bfloat16" and 1e-5 < picked.rel_err < 2e-2
    # int8: visibly less exact than float32, and on the same classes as PyTorch's float32
    assert int8.precision == "int8" and 1e-4 < int8.rel_err < 5e-2
    assert int8.agreement["top1"] >= 0.9
    assert by["torch-eager"].precision == "float32" and by["torch-eager"].agreement is None
    assert min(r.ratio_to_best_peer for r in report.results) == 1.0


def test_int8_reports_the_cosine_similarity_of_an_encoder():
    report = bench("tiny-transformer", ["onnxruntime-int8", "openvino-fp32"])
    assert not report.skipped
    by = {r.engine: r for r in report.results}
    assert by["openvino-fp32"].rel_err < 1e-4
    int8 = by["onnxruntime-int8"]
    assert 1e-4 < int8.rel_err < 5e-2
    assert set(int8.agreement) == {"cosine"} and 0.99 < int8.agreement["cosine"] <= 1.0


def test_the_table_names_a_peers_own_precision_and_its_agreement(capsys):
    from tvmfuse.bench.report import Report, Result
    from tvmfuse.cli.bench import _print_table

    report = Report("resnet50", "avx512", 2, 1, "float32", flops=None, peak_gflops=None)
    report.results += [
        Result("openvino", 20.0, 19.0, 21.0, 3, 0.5, 5e-3, None, precision="bfloat16"),
        Result("onnxruntime-int8", 25.0, 24.0, 26.0, 3, 40.0, 2e-2, None, precision="int8",
               agreement={"top1": 0.99}),
        Result("openvino-fp32", 35.0, 34.0, 36.0, 3, 0.3, 1e-6, None, precision="float32"),
    ]
    report.finish()
    _print_table(report)
    out = capsys.readouterr().out
    assert "openvino (bf16)" in out and "top-1 99%" in out
    # a name that says its precision, or the bench's own precision, gets no suffix
    assert "onnxruntime-int8 (" not in out and "openvino-fp32 (" not in out
