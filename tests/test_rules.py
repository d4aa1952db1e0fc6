from pathlib import Path

import pytest

from tvmfuse import TvmfuseError
from tvmfuse.rules import RULES, load_rules

from conftest import HOST


def test_shipped_rules_cover_every_rule():
    rules = load_rules("avx512")
    assert set(rules) == set(RULES)
    # head_matmul is CUDA's (the tensor-core GEMM reads through the head split; CPUs fuse the
    # whole attention)
    # and space_to_depth_conv too (it feeds the tensor cores' 16-byte loads); mma_gemm is off
    # everywhere until it has run in a model on the GPU; on AVX-512 a bf16 residual stream
    # stays float32 (store_narrowed off: the error of OpenVINO's bf16, docs/precision.md)
    assert [name for name, rule in rules.items() if not rule.enabled] == [
        "store_narrowed", "space_to_depth_conv", "mma_gemm", "head_matmul"]
    assert not load_rules("cuda")["mma_gemm"].enabled
    assert load_rules("cuda")["head_matmul"].enabled
    assert load_rules("cuda")["space_to_depth_conv"].enabled
    # Winograd is on where it was measured faster than the direct convs (BENCHMARKS.md)
    assert [name for name, rule in load_rules("x86-64").items() if not rule.enabled] == [
        "winograd_conv2d", "space_to_depth_conv", "mma_gemm", "head_matmul"]
    assert rules["conv_epilogue"].priority > rules["add_layer_norm"].priority


def test_target_section_overrides_default(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text(
        "[default]\nadd_layer_norm = { enabled = false }\n"
        "[cuda]\nadd_layer_norm = { enabled = true, max_group_size = 3 }\n"
    )
    assert not load_rules(HOST, path)["add_layer_norm"].enabled
    cuda = load_rules("cuda", path)["add_layer_norm"]
    assert cuda.enabled and cuda.max_group_size == 3
    assert cuda.priority == load_rules("cuda")["add_layer_norm"].priority  # untouched keys stay


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[default]\nconv_bn_relu = { enabled = true }\n", "unknown rule 'conv_bn_relu'"),
        ("[riscv]\nconv_epilogue = { enabled = true }\n", "unknown section [riscv]"),
        ("[default]\nconv_epilogue = { enable = true }\n", "conv_epilogue.enable = True"),
        ("[default]\nconv_epilogue = { priority = 'high' }\n", "conv_epilogue.priority"),
        ("[default]\nconv_epilogue = { max_group_size = 0 }\n", "max_group_size must be >= 1"),
        ("[default]\nconv_epilogue = true\n", "must be a table"),
        ("[default\n", "not valid TOML"),
    ],
)
def test_bad_rules_are_one_clear_error(tmp_path, text, message):
    path = tmp_path / "rules.toml"
    path.write_text(text)
    with pytest.raises(TvmfuseError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_rules(HOST, path)


def test_missing_rules_file_is_an_error(tmp_path):
    with pytest.raises(TvmfuseError, match="cannot read fusion rules"):
        load_rules(HOST, tmp_path / "none.toml")


def test_the_registry_is_the_docs_table_and_the_shipped_file():
    """Every rule is declared once (rules.REGISTRY); docs/fusion-rules.md's table and the shipped
    rules file's [default] section list exactly those, in that order."""
    import tomllib
    from importlib import resources

    from tvmfuse import rules

    page = (Path(__file__).resolve().parent.parent / "docs" / "fusion-rules.md").read_text()
    assert rules.markdown_table() in page
    shipped = tomllib.loads(resources.files("tvmfuse").joinpath("fusion_rules.toml").read_text())
    assert tuple(shipped["default"]) == rules.RULES
    assert set(rules.FUSION_RULES) < set(rules.RULES)
