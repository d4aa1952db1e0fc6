"""An installed wheel, not the checkout: it carries the hand-written schedules and the committed
tuning databases (read-only), and `tvmfuse tune` writes to the user's folder, which the next
build applies first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import HOST, REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel built from this checkout, unpacked into a folder of its own (its dependencies
    are this environment's), and an environment that finds it there first."""
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-q", "-w",
                    str(root / "dist")], check=True, capture_output=True)
    (wheel,) = (root / "dist").glob("tvmfuse-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(root / "site"), str(wheel)], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k != "TVMFUSE_TUNING_LOGS"}
    env.update(PYTHONPATH=str(root / "site"), XDG_CACHE_HOME=str(root / "cache"),
               PYTHONWARNINGS="ignore")
    return root, env


def _python(code: str, env: dict, cwd) -> dict:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, env=env, cwd=cwd, timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_an_installed_copy_finds_the_shipped_database_and_writes_elsewhere(installed):
    root, env = installed
    found = _python("""
        import json
        import tvmfuse
        from tvmfuse import env, targets
        from tvmfuse.schedules import cpu
        from tvmfuse.tuning import lookup
        shipped = {p.name: lookup.shipped_database(targets.avx512_for(p.name[7:])) is not None
                   for p in env.SHIPPED_TUNING_LOGS.glob("avx512-*")}
        print(json.dumps({"package": tvmfuse.__file__, "schedules": cpu.__file__,
                          "shipped_root": str(env.SHIPPED_TUNING_LOGS), "shipped": shipped,
                          "user_root": str(env.TUNING_LOGS)}))
    """, env, root)
    site = root / "site"
    assert found["package"].startswith(str(site)) and found["schedules"].startswith(str(site))
    assert found["shipped_root"] == str(site / "tvmfuse" / "tuning_logs")
    assert found["shipped"] and all(found["shipped"].values()), found["shipped"]
    assert found["user_root"] == str(root / "cache" / "tvmfuse" / "tuning_logs")


@pytest.mark.slow  # a tuning and a build in fresh processes of the installed copy: 40 s
def test_tune_writes_to_the_user_folder_and_the_build_applies_it_first(installed):
    root, env = installed
    shipped = root / "site" / "tvmfuse" / "tuning_logs"
    before = {p: p.read_bytes() for p in shipped.rglob("*.json")}
    tune = subprocess.run([sys.executable, "-m", "tvmfuse", "tune", "tiny-resnet", "--trials",
                           "0"], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert tune.returncode == 0, tune.stderr
    user = list((root / "cache" / "tvmfuse" / "tuning_logs").glob(f"{HOST}-*"))
    assert len(user) == 1 and (user[0] / "database_tuning_record.json").is_file()
    assert {p: p.read_bytes() for p in shipped.rglob("*.json")} == before  # untouched
    applied = _python("""
        import json
        from tvmfuse import api
        target = api.get_target()
        _, analysis = api.analyze(api.import_model("tiny-resnet"), target, api.BuildOptions(),
                                  until="schedule")
        print(json.dumps({"databases": [str(d) for d in analysis.databases],
                          "untuned": analysis.untuned}))
    """, env, root)
    assert applied["databases"][0] == str(user[0])  # the user's records first
    assert applied["untuned"] == []  # tiny-resnet's kernels: the user's seeds
