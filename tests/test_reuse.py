"""The keys that decide whether ``tvmfuse build`` keeps an earlier build (tvmfuse.reuse): what
enters them and where the key known before the import cannot be had."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tvmfuse import targets
from tvmfuse.options import BuildOptions
from tvmfuse.reuse import source_key

IMPORT = {"input_shapes": [], "dynamic": [], "max_seq": None}


def _key(source, **options):
    return source_key(str(source), IMPORT, "x86-64", BuildOptions(use_database=False, **options))


def _onnx_model(weight: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, weight.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, weight.shape[1]])],
        [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph)


def test_a_model_files_key_follows_its_bytes(tmp_path):
    path = tmp_path / "net.onnx"
    onnx.save(_onnx_model(np.ones((64, 64), "float32")), path)
    first = _key(path)
    assert len(first) == 64 and _key(path) == first
    onnx.save(_onnx_model(np.full((64, 64), 2, "float32")), path)  # other weights, same graph
    assert _key(path) != first
    assert _key("resnet50") != _key("mobilenet_v2")


def test_no_source_key_where_the_weights_may_live_elsewhere(tmp_path):
    """A Python factory may read its weights from anywhere, and an ONNX file may keep them in
    files of its own: their builds are kept only after the import, by the build key."""
    path = tmp_path / "net.onnx"
    onnx.save(_onnx_model(np.ones((64, 64), "float32")), path, save_as_external_data=True,
              location="net.weights", size_threshold=0)
    assert (tmp_path / "net.weights").is_file()
    assert _key(path) is None
    assert _key("my_models.nets:resnet") is None


def test_the_fusion_rules_enter_the_key_by_their_contents(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text("[default]\nfused_attention = { enabled = true }\n")
    first = _key("tiny-resnet", fusion_rules=rules)
    rules.write_text("[default]\nfused_attention = { enabled = false }\n")
    assert _key("tiny-resnet", fusion_rules=rules) != first
    assert _key("tiny-resnet", dtype="float16") != _key("tiny-resnet")


def test_a_host_targets_key_covers_every_database_it_could_apply(tmp_path, monkeypatch):
    """The source key cannot ask LLVM which of the host target's databases (``avx512-<cpu>``)
    a build applies without importing TVM: it digests every one the target's name matches."""
    from tvmfuse import env
    from tvmfuse.tuning import database

    monkeypatch.setattr(env, "TUNING_LOGS", tmp_path)
    before = source_key("tiny-resnet", IMPORT, "avx512", BuildOptions())
    assert source_key("tiny-resnet", IMPORT, "avx512", BuildOptions()) == before
    folder = tmp_path / "avx512-another-cpu"
    folder.mkdir()
    for name in database.FILES:
        (folder / name).write_text("{}\n")
    assert source_key("tiny-resnet", IMPORT, "avx512", BuildOptions()) != before
    assert source_key("tiny-resnet", IMPORT, "avx512", BuildOptions(use_database=False)) != before
    assert "cores=" in targets.fingerprint("avx512")[0]
    assert targets.fingerprint("cuda-sm90")[1] == "cuda-sm90"
