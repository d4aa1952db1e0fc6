"""The build's time report: one line at the end of ``tvmfuse build`` and the same figures in
``manifest.json``, stage by stage, adding up to the build's wall time."""

import json
import re
import time

from tvmfuse import pipeline
from tvmfuse.buildtime import STAGES, BuildTimes

from conftest import HOST, run_cli


def test_build_reports_its_stages_and_they_add_up_to_the_total(tmp_path):
    out = tmp_path / "out"
    result = run_cli("build", "tiny-resnet", "--target", HOST, "-o", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    seconds = json.loads((out / "manifest.json").read_text())["build_seconds"]
    stages = seconds["stages"]
    assert list(stages) == [s for s in STAGES if s in stages]  # in the order they ran
    assert {"startup", "import", "reuse", "database", *pipeline.PHASES, "analysis", "tir_lower",
            "codegen", "export", "reference"} <= set(stages)
    assert "cuda_compile" not in stages and seconds["cuda_binaries"]["at_load"] is False
    assert all(s >= 0 for s in stages.values())
    # what no stage measures (argument checks, logging, the staging folder) is a sliver
    assert 0.9 * seconds["total"] <= sum(stages.values()) <= seconds["total"]
    line = re.search(r"build time ([\d.]+) s: startup [\d.]+, import [\d.]+, reuse check [\d.]+, "
                     r"passes [\d.]+, "
                     r"scheduling [\d.]+, TIR lowering [\d.]+, codegen [\d.]+, export [\d.]+, "
                     r"reference outputs [\d.]+, other [\d.]+$", result.stderr, re.MULTILINE)
    assert line, result.stderr[-2000:]
    assert abs(float(line.group(1)) - seconds["total"]) < 0.5


def test_the_line_names_cuda_compiled_at_load_and_checks_after_the_build():
    times = BuildTimes(started=time.perf_counter() - 10)
    times.add("import", 2.0)
    times.add("schedule", 5.0)
    times.add("database", 1.0)
    times.add("export", 0.5)
    times.cuda_at_load = True
    line = times.line({"verify": 3.0})
    assert re.fullmatch(r"build time 13\.0 s: import 2\.0, scheduling 6\.0, CUDA compile when "
                        r"the library loads, export 0\.5, other 1\.5, verify 3\.0", line), line
    times.cuda_at_load = False
    times.add("cuda_compile", 0.5)
    times.cuda_cached, times.cuda_compiled = 2, 1
    assert "CUDA compile 0.5 (2 cached, 1 compiled)" in times.line()
    assert times.to_json()["cuda_binaries"] == {"cached": 2, "compiled": 1, "at_load": False}
