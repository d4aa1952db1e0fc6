"""The numeric gate: every fused group checked, and a failing one split back into its ops."""

import logging

import pytest

from tvmfuse import api, pipeline
from tvmfuse.passes import verify_fusion
from tvmfuse.verify import verify

from conftest import HOST

TARGET = api.get_target(HOST)


def _analyze(model, **options):
    return api.analyze(model, TARGET, api.BuildOptions(**options))[1]


def test_every_group_passes_on_a_healthy_model(caplog):
    model = api.import_model("tiny-resnet")
    with caplog.at_level(logging.INFO):
        gated = _analyze(model, verify_fusion=True)
    assert "5 fused group(s) built and compared, 0 split back" in caplog.text
    assert gated.groups == _analyze(model).groups


def test_a_group_that_disagrees_is_split_back_with_a_warning(monkeypatch, caplog, tmp_path):
    compare = verify_fusion._compare

    def broken_relu_groups(func, outs, refs, tolerance):
        if str(func.attrs["Composite"]) == "tvmfuse.conv_epilogue.bias_relu" and (
                "concat" not in func.script()):
            return "output 0 differs from the unfused ops: relative L2 error 1.00e+00 > 1e-04"
        return compare(func, outs, refs, tolerance)

    monkeypatch.setattr(verify_fusion, "_compare", broken_relu_groups)
    model = api.import_model("tiny-resnet")
    with caplog.at_level(logging.WARNING):
        compiled = api.compile_model(model, TARGET, api.BuildOptions(verify_fusion=True))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3
    assert all(w.startswith("fusion tvmfuse.conv_epilogue.bias_relu (") and "relative L2 error"
               in w for w in warnings)
    rules = [g.rule for g in compiled.analysis.groups]
    # the others keep their fusion: the block's last conv with the downsample, the linear layer
    assert sorted(rules) == ["tvmfuse.conv_epilogue.bias_relu", "tvmfuse.matmul_epilogue.bias"]
    assert "concatenate" in compiled.analysis.groups[rules.index(
        "tvmfuse.conv_epilogue.bias_relu")].ops
    # 6 kernels; apart: the stem's transpose, conv, add and relu, and twice conv, add, relu
    assert len(compiled.analysis.kernels) == 6 + 3 + 2 * 2
    verify(api.load(api.build(compiled, tmp_path / "out")), model)


def test_a_group_that_fails_to_build_is_split_back(monkeypatch, caplog):
    make_builder = pipeline._group_builder

    def failing_builder(plan):
        build = make_builder(plan)

        def build_or_fail(mod):
            if any("matmul" in gv.name_hint and "fused" in gv.name_hint for gv in mod.functions):
                raise RuntimeError("InternalError: cannot lower fused_matmul_add")
            return build(mod)

        return build_or_fail

    monkeypatch.setattr(pipeline, "_group_builder", failing_builder)
    with caplog.at_level(logging.WARNING):
        analysis = _analyze(api.import_model("tiny-resnet"), verify_fusion=True)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("fusion tvmfuse.matmul_epilogue.bias (")
    assert "fails to build: InternalError: cannot lower fused_matmul_add" in warning
    assert all("matmul" not in g.ops for g in analysis.groups)


def test_symbolic_groups_are_reported_not_checked(caplog):
    model = api.import_model("tiny-resnet", dynamic=["batch"])
    with caplog.at_level(logging.INFO):
        analysis = _analyze(model, verify_fusion=True)
    assert "6 with symbolic shapes not checked" in caplog.text
    assert len(analysis.groups) == 6


@pytest.mark.parametrize("target", ["arm64"])
def test_targets_that_cannot_run_here_are_checked_for_building_only(target, caplog):
    with caplog.at_level(logging.INFO):
        api.analyze(api.import_model("tiny-resnet"), api.get_target(target),
                    api.BuildOptions(verify_fusion=True))
    assert "5 fused group(s) built, 0 split back" in caplog.text
