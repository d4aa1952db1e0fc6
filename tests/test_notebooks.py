"""Every notebook runs top to bottom in a fresh kernel; a cell error fails the test."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


#: The tuning notebook runs a real search (80 s on 2 cores): in the slow suite; the default run
#: has its one tiny tuning in tests/tuning/test_tune.py.
SLOW = {"02_tuning"}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW
                                  else p for p in NOTEBOOKS], ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors


def test_there_are_notebooks():
    assert {p.stem for p in NOTEBOOKS} >= {"01_fusion_walkthrough", "03_deploy"}
