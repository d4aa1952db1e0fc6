"""BENCHMARKS.md is what ``benchmarks/report.py`` makes of ``benchmarks/results/``, and every
table in it names the machine, the commit and the command behind its numbers. The script runs as
a subprocess (tests import nothing from benchmarks/)."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPORT = REPO / "benchmarks" / "report.py"
BEGIN, END = "<!-- standings:begin -->", "<!-- standings:end -->"


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPORT), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_benchmarks_md_is_what_report_py_makes():
    done = report("--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_table_names_machine_commit_and_command():
    lines = (REPO / "BENCHMARKS.md").read_text().splitlines()
    tables = 0
    for i, line in enumerate(lines):
        if not line.startswith("|") or (i + 1 < len(lines) and lines[i + 1].startswith("|")):
            continue
        tables += 1  # the table's last row: its provenance follows after one blank line
        source = lines[i + 2] if i + 2 < len(lines) else ""
        assert re.match(r"Measured on .+ \(`[a-z0-9]+`\) at [0-9a-f]{7,40} \((measured|added)\)"
                        r".*; reproduce:$", source), (i + 1, source)
        assert lines[i + 4].startswith("- `") and lines[i + 4].endswith("`"), (i + 5, lines[i + 4])
    assert tables >= 5


def test_check_fails_on_a_stale_file_and_fills_the_readme_block(tmp_path):
    out, readme = tmp_path / "BENCHMARKS.md", tmp_path / "README.md"
    readme.write_text(f"# tvmfuse\n\n{BEGIN}\nold\n{END}\n\nmore\n")
    assert report("--out", str(out), "--readme", str(readme)).returncode == 0
    text = readme.read_text()
    assert text.startswith(f"# tvmfuse\n\n{BEGIN}\n") and text.endswith(f"{END}\n\nmore\n")
    assert "old" not in text and "| model | tvmfuse ms | best peer |" in text
    assert report("--check", "--out", str(out), "--readme", str(readme)).returncode == 0

    readme.write_text(text.replace("| model | tvmfuse ms", "| model | ours ms", 1))
    done = report("--check", "--out", str(out), "--readme", str(readme))
    assert done.returncode == 1 and done.stdout.count("\n") == 1, done.stdout
    assert "README.md is not what benchmarks/report.py makes" in done.stdout

    out.write_text(out.read_text() + "a hand edit\n")
    done = report("--check", "--out", str(out), "--readme", str(tmp_path / "none.md"))
    assert done.returncode == 1 and "BENCHMARKS.md" in done.stdout, done.stdout


def test_every_reproduce_command_names_scripts_that_exist():
    """A result's command must still run: the scripts and files it names are in the tree."""
    import json

    for path in sorted((REPO / "benchmarks" / "results").glob("*/*.json")):
        command = json.loads(path.read_text())["reproduce"]
        for script in re.findall(r"(?:benchmarks|tests|tvmfuse)/[\w./-]+\.(?:py|sh)", command):
            assert (REPO / script).is_file(), (path.name, script)


def test_the_best_of_all_peers_is_named_with_its_precision(tmp_path):
    """OpenVINO in bf16 and ONNX Runtime int8 are peers like the others: the fastest of all is
    the one tvmfuse is held against, named beside the ratio and in README's standings."""
    import json

    def result(engine, ms, precision="float32"):
        return {"engine": engine, "median_ms": ms, "precision": precision}

    (tmp_path / "results" / "zen4").mkdir(parents=True)
    (tmp_path / "results" / "zen4" / "resnet50.json").write_text(json.dumps({
        "model": "resnet50", "target": "avx512", "dtype": "float32", "batch": 1,
        "commit": "abc1234", "commit_is": "measured", "reproduce": "tvmfuse bench resnet50",
        "results": [result("tvmfuse", 30.0), result("onnxruntime", 40.0),
                    result("openvino", 20.0, "bfloat16"), result("openvino-fp32", 35.0),
                    result("onnxruntime-int8", 25.0, "int8")]}))
    out, readme = tmp_path / "BENCHMARKS.md", tmp_path / "README.md"
    readme.write_text(f"{BEGIN}\n{END}\n")
    done = report("--results", str(tmp_path / "results"), "--out", str(out), "--readme",
                  str(readme))
    assert done.returncode == 0, done.stdout + done.stderr
    text = out.read_text()
    assert ("| tvmfuse ms | ONNX Runtime ms | ONNX Runtime int8 ms | OpenVINO bf16 ms | "
            "OpenVINO fp32 ms | vs best peer | error: tvmfuse / best peer |") in text
    assert "| 30.00 | 40.00 | 25.00 | 20.00 | 35.00 | 1.50x (OpenVINO bf16) | - / - |" in text
    assert "| resnet50, fp32 | 30.00 | OpenVINO bf16 | 20.00 | 1.50x |" in readme.read_text()


def test_build_time_and_gpu_coverage_tables(tmp_path):
    """benchmarks/build_time.py's JSON becomes a table of seconds by stage group, and a GPU
    kind's coverage sweep (one path, fp16) a coverage table naming its target."""
    import json

    kind = tmp_path / "results" / "h100"
    kind.mkdir(parents=True)
    stages = {"startup": 12.0, "import": 7.0, "fold": 3.0, "legalize": 5.0, "schedule": 9.0,
              "tir_lower": 4.0, "codegen": 0.5, "cuda_compile": 7.0, "export": 1.0}
    common = {"machine": "h100", "commit": "abc1234", "commit_is": "measured"}
    (kind / "build-time.json").write_text(json.dumps({
        **common, "reproduce": "python benchmarks/build_time.py --target cuda-sm90",
        "target": "cuda-sm90", "dtype": "fp16", "cores": 16, "build_time": [
            {"model": "resnet50", "run": "cold", "wall_s": 51.0, "total": 49.5,
             "stages": stages},
            {"model": "bert-base", "run": "cold", "error": "TvmfuseError: | no GPU"}]}))
    result = {"exported": True, "built": True, "verified": True, "cause": None}
    failed = {"exported": True, "built": False, "verified": False, "stage": "compile",
              "error": "x", "cause": "build error"}
    (kind / "coverage.json").write_text(json.dumps({
        **common, "reproduce": "python benchmarks/coverage.py --target cuda-sm90",
        "target": "cuda-sm90", "dtype": "fp16", "causes": {"build error": 1},
        "coverage": [{"type": "bert", "torch": result}, {"type": "gpt2", "torch": failed}]}))
    out = tmp_path / "BENCHMARKS.md"
    done = report("--results", str(tmp_path / "results"), "--out", str(out), "--readme",
                  str(tmp_path / "none.md"))
    assert done.returncode == 0, done.stdout + done.stderr
    text = out.read_text()
    assert ("| model | run | wall s | startup | import | reuse check | passes | scheduling | "
            "TIR lowering | codegen | CUDA compile | export |") in text
    assert ("| resnet50 | cold | 51.0 | 12.0 | 7.0 | 0.0 | 8.0 | 9.0 | 4.0 | 0.5 | 7.0 | 1.0 |"
            in text)
    assert "| bert-base | cold | TvmfuseError: \\| no GPU |" in text
    assert "fp16, built untuned and verified for cuda-sm90, run on the GPU" in text
    assert "| torch.export | 2 | 2 | 1 | 1 | 50% | build error (1) |" in text
    assert "| ONNX |" not in text and "- torch.export, build error: gpt2" in text


def test_coverage_merge_files_parts_by_type(tmp_path):
    """`coverage.py --merge` files parallel sweeps' records into the JSON by model type: a
    part's record replaces the one held, the rest stay, in the sweep's order."""
    import json

    def record(model_type, verified, commit):
        path = {"exported": True, "built": verified, "verified": verified,
                "cause": None if verified else "build error"}
        return {"type": model_type, "torch": path, "onnx": path, "commit": commit}

    held, part = tmp_path / "coverage.json", tmp_path / "part.json"
    held.write_text(json.dumps({"reproduce": "python benchmarks/coverage.py", "coverage": [
        record("gpt2", False, "old"), record("bert", True, "old")]}))
    part.write_text(json.dumps({"coverage": [record("gpt2", True, "new"),
                                             record("roberta", False, "new")]}))
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "coverage.py"), "--merge",
                           str(part), "--json", str(held), "--kind", "zen4"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    merged = json.loads(held.read_text())
    assert [(r["type"], r["commit"]) for r in merged["coverage"]] == [
        ("bert", "old"), ("roberta", "new"), ("gpt2", "new")]
    assert merged["causes"] == {"build error": 2} and merged["machine"] == "zen4"
