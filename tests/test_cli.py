"""The command line: help everywhere, one-line errors, and a run path that never imports torch."""

import json

import numpy as np
import pytest

from conftest import run_cli


def _one_error_line(result, pattern: str) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "ERROR" in lines[0] and pattern in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("command", [[], ["build"], ["run"], ["inspect"]])
def test_help(command):
    result = run_cli(*command, "--help")
    assert result.returncode == 0
    assert "usage: tvmfuse" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["build", "resnet51", "-o", "x"], "unknown model 'resnet51'"),
        (["build", "tiny-resnet", "--target", "sparc", "-o", "x"], "unknown target 'sparc'"),
        (["build", "tiny-resnet", "--input-shape", "1,4,32,32", "-o", "x"],
         "cannot run on inputs x(1, 4, 32, 32)"),
        (["build", "tiny-resnet", "--input-shape", "1,3,32,32:int64", "-o", "x"],
         "cannot run on inputs x(1, 3, 32, 32):int64"),
        (["build", "missing.onnx", "-o", "x"], "model file missing.onnx does not exist"),
        (["run", "no-such-build", "--random"], "no-such-build is not a tvmfuse build"),
    ],
)
def test_bad_input_is_one_error_line(tmp_path, args, message):
    _one_error_line(run_cli(*args, cwd=tmp_path), message)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli") / "tiny"
    result = run_cli("build", "tiny-resnet", "-o", str(folder), "--verify")
    assert result.returncode == 0, result.stderr
    assert "verified 1 output(s) against pytorch" in result.stderr
    return folder


def test_run_uses_the_runtime_alone_and_writes_outputs(built, tmp_path):
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "y.npz"
    code = (
        "import sys\n"
        "from tvmfuse.cli import main\n"
        f"rc = main(['run', {str(built)!r}, '--input', {str(tmp_path / 'x.npy')!r}, "
        f"'-o', {str(out)!r}, '--repeat', '2'])\n"
        "assert rc == 0, rc\n"
        "loaded = [m for m, v in sys.modules.items() if m.split('.')[0] == 'torch' and v]\n"
        "assert not loaded, f'tvmfuse run imported {loaded[:3]}'\n"
    )
    result = run_cli(code=code)
    assert result.returncode == 0, result.stderr
    assert "median" in result.stderr
    with np.load(out) as outputs:
        assert outputs["output0"].shape == (1, 10)

    import torch

    from tvmfuse import zoo

    with torch.no_grad():
        ref = zoo.get("tiny-resnet").build()(torch.from_numpy(x)).numpy()
    with np.load(out) as outputs:
        np.testing.assert_allclose(outputs["output0"], ref, rtol=1e-4, atol=1e-5)


def test_a_fp16_build_records_its_precision_and_verifies_within_it(tmp_path):
    """``--dtype fp16``: float16 kernels behind float32 inputs and outputs, their error judged
    against float16's 1e-2 (float32's 1e-4 would fail them), at build and by ``run --check``
    against the reference saved with the build."""
    folder = tmp_path / "fp16"
    result = run_cli("build", "tiny-transformer", "--dtype", "fp16", "-o", str(folder),
                     "--verify")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["precision"] == "float16"
    worst = float(result.stderr.split("worst relative L2 error ")[1].split()[0])
    assert 1e-4 < worst < 1e-2  # float16's error: more than float32 would have, within 1e-2
    # the manifest records the error and PyTorch's own in float16 on the same inputs
    (check,) = manifest["verification"]["checks"]
    assert check["rel_err"] == pytest.approx(worst, rel=1e-2)
    assert check["peer"] == "pytorch float16" and 1e-4 < check["peer_err"] < 1e-2
    assert check["at"] == manifest["verification"]["examples_at"]
    result = run_cli("run", str(folder), "--check", cwd=tmp_path)  # (it writes outputs.npz)
    assert result.returncode == 0, result.stderr


def test_run_check_accepts_the_recorded_peer_error_over_the_tolerance(tmp_path):
    """A narrow build over its precision's tolerance passes ``run --check`` only where it is no
    less accurate than PyTorch in that precision was on the saved inputs (the manifest's
    record): the saved reference is moved 5% away here, past bf16's 2e-2."""
    folder = tmp_path / "bf16"
    assert run_cli("build", "tiny-transformer", "--dtype", "bf16", "-o", str(folder),
                   "--verify").returncode == 0
    with np.load(folder / "check.npz") as saved:
        arrays = dict(saved)
    rng = np.random.default_rng(0)
    ref = arrays["output:output0"]
    noise = rng.standard_normal(ref.shape).astype("float32")
    arrays["output:output0"] = ref + 0.05 * noise * np.linalg.norm(ref) / np.linalg.norm(noise)
    np.savez(folder / "check.npz", **arrays)
    result = run_cli("run", str(folder), "--check", cwd=tmp_path)
    assert result.returncode != 0
    assert "> tolerance 2e-02 and pytorch bfloat16's" in result.stderr
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["verification"]["checks"][0]["peer_err"] = 0.08
    (folder / "manifest.json").write_text(json.dumps(manifest))
    result = run_cli("run", str(folder), "--check", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no less accurate than pytorch bfloat16" in result.stderr
    manifest["verification"]["checks"][0]["peer_err"] = "high"  # a damaged record
    (folder / "manifest.json").write_text(json.dumps(manifest))
    _one_error_line(run_cli("run", str(folder), "--check", cwd=tmp_path),
                    "manifest.json is damaged (its verification record")


def test_run_rejects_wrong_shape_and_dtype(built, tmp_path):
    np.save(tmp_path / "bad_shape.npy", np.zeros((1, 3, 16, 16), "float32"))
    np.save(tmp_path / "bad_dtype.npy", np.zeros((1, 3, 32, 32), "float64"))
    _one_error_line(run_cli("run", str(built), "--input", str(tmp_path / "bad_shape.npy")),
                    "input 'x' has shape (1, 3, 16, 16), the model expects (1, 3, 32, 32)")
    _one_error_line(run_cli("run", str(built), "--input", str(tmp_path / "bad_dtype.npy")),
                    "input 'x' has dtype float64, the model expects float32")
    _one_error_line(run_cli("run", str(built), "--input", str(tmp_path / "none.npy")),
                    "does not exist")


def test_inspect_json_compares_three_pipelines():
    result = run_cli("inspect", "tiny-resnet", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    pipelines = report["pipelines"]
    assert set(pipelines) == {"unfused", "stock", "tvmfuse"}
    # stem, two convs of the block, its last conv with the downsample merged, mean, classifier
    assert pipelines["tvmfuse"]["kernels"] == 6
    assert (pipelines["tvmfuse"]["kernels"] < pipelines["stock"]["kernels"]
            < pipelines["unfused"]["kernels"])
    assert (pipelines["tvmfuse"]["bytes"] < pipelines["stock"]["bytes"]
            < pipelines["unfused"]["bytes"])
    merged = {"rule": "tvmfuse.conv_epilogue.bias_relu",
              "ops": ["strided_slice", "concatenate", "conv2d", "add", "relu"]}
    assert merged in [{k: g[k] for k in ("rule", "ops")} for g in report["groups"]]
    # each group's shapes: the stem reads the NCHW image (its NHWC transpose is the kernel's
    # prologue) and 3x3x3x16 HWIO weights, and writes NHWC
    stem = report["groups"][0]
    assert stem["ops"][0] == "transpose"
    assert stem["inputs"][:2] == [[1, 3, 32, 32], [3, 3, 3, 16]] and stem["output"][-1] == 16


def test_inspect_prints_the_table_and_honours_a_rules_file(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text("[default]\nnot_a_rule = { enabled = true }\n")
    _one_error_line(run_cli("inspect", "tiny-resnet", "--fusion-rules", str(rules)),
                    "unknown rule 'not_a_rule'")
    result = run_cli("inspect", "tiny-resnet")
    assert result.returncode == 0, result.stderr
    assert "unfused" in result.stdout and "tvmfuse.conv_epilogue.bias_relu" in result.stdout


def test_inspect_profile_times_every_kernel_with_its_implementation():
    result = run_cli("inspect", "tiny-resnet", "--profile", "--no-db", "--json")
    assert result.returncode == 0, result.stderr
    kernels = json.loads(result.stdout)["kernels"]
    assert len(kernels) == 6  # every distinct kernel of tiny-resnet, slowest first
    assert [k["ms"] for k in kernels] == sorted((k["ms"] for k in kernels), reverse=True)
    convs = [k for k in kernels if "conv2d" in k["kernel"]]
    assert convs and all(k["implementation"] == "cpu.conv2d" and k["gflops"] > 0 for k in convs)


def test_the_same_build_again_keeps_the_folder_and_any_change_builds_anew(tmp_path):
    """``tvmfuse build`` into a folder holding the build it would write (the same model and
    weights, options, target, records and tvmfuse: the manifest's ``build_key``) keeps it, and
    verifies it when asked; other weights, another option or a library that is not the one the
    manifest describes each compile again (``--no-cache`` does: tests/test_cli_faults.py's
    full-disk builds rely on it)."""
    factory = tmp_path / "net.py"
    source = """
import torch

def model():
    torch.manual_seed({seed})
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
"""
    factory.write_text(source.format(seed=0))
    folder = tmp_path / "out"
    kept = "holds this build already"

    def build(*extra):
        result = run_cli("build", f"{factory}:model", "--input-shape", "2,8", "-o", str(folder),
                         *extra)
        assert result.returncode == 0, result.stderr
        return result.stderr, json.loads((folder / "manifest.json").read_text())

    log, first = build()
    assert kept not in log and len(first["build_key"]) == 64
    log, again = build("--verify")
    assert kept in log and "verified 1 output" in log and "compiling" not in log
    assert again["created"] == first["created"] and again["verification"]["checks"]
    assert "kept" not in first and again["build_seconds"] == first["build_seconds"]
    kept_stages = again["kept"]["build_seconds"]["stages"]
    assert "reuse" in kept_stages and "fold" not in kept_stages
    log, fp16 = build("--dtype", "fp16")  # another option
    assert kept not in log and fp16["build_key"] != first["build_key"]
    factory.write_text(source.format(seed=1))  # other weights, same structure
    log, reseeded = build("--dtype", "fp16")
    assert kept not in log and reseeded["build_key"] not in (fp16["build_key"], first["build_key"])
    with open(folder / "model.so", "ab") as library:  # no longer the library the manifest names
        library.write(b"\0")
    log, _ = build("--dtype", "fp16")
    assert kept not in log
    assert kept in build("--dtype", "fp16")[0]


def test_an_unchanged_model_file_is_kept_before_its_import(tmp_path):
    """A model file built again unchanged, unverified, is kept by its source key (the file's
    bytes with what the build key digests beside the model) before the import: the kept build's
    only stage is the key's; a file with other weights builds anew."""
    import torch

    model = tmp_path / "net.pt2"

    def save(seed):
        torch.manual_seed(seed)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()).eval()
        torch.export.save(torch.export.export(net, (torch.randn(2, 8),)), model)

    def build():
        result = run_cli("build", str(model), "-o", str(tmp_path / "out"))
        assert result.returncode == 0, result.stderr
        return result.stderr, json.loads((tmp_path / "out" / "manifest.json").read_text())

    save(0)
    log, first = build()
    assert "holds this build already" not in log and len(first["source_key"]) == 64
    log, again = build()
    assert "kept it in" in log and list(again["kept"]["build_seconds"]["stages"]) == ["reuse"]
    save(1)
    log, other = build()
    assert "holds this build already" not in log and other["source_key"] != first["source_key"]
