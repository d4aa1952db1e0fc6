"""The zoo's names: listed by ``tvmfuse build --list`` and in the unknown-model error, both
before torch is imported, and each backed by a factory."""

from __future__ import annotations

import re
import textwrap

import pytest

from tvmfuse import zoo

from conftest import run_cli

#: Runs the CLI with ``ARGS`` and fails if torch or TVM was imported on the way.
LIGHT = textwrap.dedent("""
    import sys
    from tvmfuse.cli import main
    try:
        rc = main(ARGS)
    except SystemExit as stop:
        rc = stop.code
    heavy = sorted(m for m in ("torch", "tvm") if sys.modules.get(m) is not None)
    assert not heavy, f"imported {heavy}"
    sys.exit(rc)
""")


@pytest.mark.parametrize("command", ["build", "bench", "tune", "inspect"])
def test_list_prints_every_zoo_name_without_importing_torch(command):
    result = run_cli(code=LIGHT.replace("ARGS", repr([command, "--list"])))
    assert result.returncode == 0, result.stderr
    listed = [line.split()[0] for line in result.stdout.splitlines()]
    assert tuple(listed) == zoo.names()
    assert {"vit", "tiny-vit", "llama-decode", "tiny-llama-decode", "mobilevit",
            "resnet50", "tiny-resnet"} <= set(listed)


def test_an_unknown_name_is_one_error_line_listing_the_zoo_without_importing_torch():
    result = run_cli(code=LIGHT.replace("ARGS", repr(["build", "vitt", "-o", "o"])))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines()
               if line.strip() and " INFO " not in line and " WARNING " not in line]
    assert "ERROR" in line and "unknown model 'vitt'" in line
    listed = re.search(r"not a zoo name \(([^)]*)\)", line).group(1).split(", ")
    assert tuple(listed) == zoo.names()


def test_every_zoo_name_has_its_factory():
    pytest.importorskip("transformers")
    from tvmfuse.zoo import popular, suite, unseen

    assert set(zoo.SUITE) == set(suite.ARCHITECTURES)
    for function, _ in zoo.UNSEEN.values():
        assert callable(getattr(unseen, function))
    assert set(zoo.POPULAR) == set(popular.FACTORIES)
    assert len(zoo.names()) == len(set(zoo.names())) == 6 + 2 * 14 + 8 + 8
