"""One real, tiny tuning run (hand-written seeds for every kernel, then a few MetaSchedule trials on
the kernel that takes the most time), then a build that applies its database and reports where
each kernel's schedule came from."""

import json

import pytest
from tvm.s_tir import meta_schedule as ms

from tvmfuse import TvmfuseError, api
from tvmfuse.tuning.tune import plan_tasks
from tvmfuse.verify import verify

from conftest import HOST

TARGET = api.get_target(HOST)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    database = tmp_path_factory.mktemp("tuning_logs") / TARGET.key
    model = api.import_model("tiny-resnet")
    _, plans = api.tune(model, TARGET, api.BuildOptions(database=database), trials=4)
    return model, database, plans


def test_tasks_are_ordered_by_share_of_flops(tuned):
    _, _, plans = tuned
    assert len(plans) == 6  # one per distinct fused kernel
    shares = [p.launches * p.flops for p in plans]
    assert shares == sorted(shares, reverse=True)
    assert not any(p.tuned for p in plans)  # a fresh database


def test_the_database_holds_records_and_a_rerun_skips_them(tuned):
    model, database, plans = tuned
    records = (database / "database_tuning_record.json").read_text().splitlines()
    # a seed per kernel, and the searched kernel's best candidate where it beat its seed when
    # both were timed again (the other candidates are kept in logs/, never applied)
    assert 6 <= len(records) <= 7
    assert list((database / "logs").glob("*/database_tuning_record.json"))
    searched = [p for p in plans if p.trials]
    assert [p.trials for p in searched] == [4]
    assert searched[0].share == max(p.share for p in plans)  # the most time, measured
    assert all(json.loads(line) for line in records)
    mod, _ = api.analyze(model, TARGET, api.BuildOptions(use_database=False))
    with TARGET.tvm_target():
        _, again = plan_tasks(mod, TARGET.tvm_target(),
                              ms.database.JSONDatabase(work_dir=str(database)))
    assert again[0].name == plans[0].name and again[0].tuned


def test_build_applies_the_database_and_lists_untuned_kernels(tuned, tmp_path):
    model, database, plans = tuned
    compiled = api.compile_model(model, TARGET, api.BuildOptions(database=database))
    assert compiled.database == database
    assert compiled.analysis.tuned == set(compiled.analysis.kernels)  # seeds cover every kernel
    folder = api.build(compiled, tmp_path / "out")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["database"]["path"] == str(database)
    assert len(manifest["database"]["sha256"]) == 64
    assert manifest["untuned_kernels"] == []
    implementations = manifest["implementations"]
    # every record is a measured hand-written seed, except where the search measured faster
    searched = next(p.name for p in plans if p.trials)
    assert all(impl.startswith("seed:cpu.") for name, impl in implementations.items()
               if name != searched)
    assert implementations[searched] in ("tuned:cpu.conv2d@1", "seed:cpu.conv2d")
    verify(api.load(folder), model)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_tune_covers_every_kernel_of_the_build_with_its_options(dtype, tmp_path):
    """Tuning extracts the kernels of the build the same options make: a fp16 tune's seeds
    (``--trials 0``) give every kernel of a fp16 build a record. (A tune that rebuilt its options
    from the fusion rules alone tuned the float32 kernels: 1 of the fp16 build's 9 launches.)"""
    model = api.import_model("tiny-transformer")
    options = api.BuildOptions(database=tmp_path / TARGET.key, dtype=dtype)
    api.tune(model, TARGET, options, trials=0, progress=False)
    _, analysis = api.analyze(model, TARGET, options, until="schedule")
    assert analysis.databases == (options.database,)
    assert len(analysis.kernels) > len(analysis.written_scheduled)
    assert analysis.untuned == []


def test_targets_that_cannot_run_here_are_refused():
    with pytest.raises(TvmfuseError, match="cannot tune for arm64 here: .* --rpc HOST:PORT:KEY"):
        api.tune(api.import_model("tiny-resnet"), api.get_target("arm64"), api.BuildOptions(),
                 trials=1)


def test_a_cpu_search_registers_the_cpu_intrinsics_only(tmp_path):
    """A TuneContext for an x86 task finds the x86 intrinsics registered (VNNI's, which its
    int8 rule asks for) and has not imported CUDA's (34 s of a CPU tuning job's start)."""
    import subprocess
    import sys

    code = (
        "import sys, tvm\n"
        "from tvm.s_tir import TensorIntrin, meta_schedule as ms\n"
        "from tvm.script import tirx as T\n"
        "from tvmfuse.tuning import intrinsics\n"
        "target = tvm.target.Target({'kind': 'llvm', 'mcpu': 'znver4', 'num-cores': 2})\n"
        "intrinsics.register_for(target)\n"
        "@T.prim_func(s_tir=True)\n"
        "def f(a: T.Buffer((4,), 'float32'), b: T.Buffer((4,), 'float32')):\n"
        "    for i in range(4):\n"
        "        with T.sblock('b'):\n"
        "            v = T.axis.remap('S', [i])\n"
        "            b[v] = a[v]\n"
        "ms.TuneContext(mod=tvm.IRModule({'main': f}), target=target,\n"
        "               space_generator='post-order-apply', search_strategy='replay-trace')\n"
        "assert TensorIntrin.get('dot_16x4_vnni') is not None\n"
        "assert 'tvm.s_tir.tensor_intrin.cuda' not in sys.modules\n"
    )
    script = tmp_path / "search.py"  # a file: TVMScript reads its source
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_seed_record_gets_its_rule_as_the_rule_is_now(tmp_path, monkeypatch):
    """Seeds recorded while the conv rule chose one-row, one-block tiles; then the rule changed
    back. The build schedules those kernels with the rule as it is now (the seed would replay
    the old tiles: the committed Zen 5 database ran ResNet-50 21.3 ms where the rules of the day
    ran it 17.1-17.6), still reported as the database's seeds; numbers against PyTorch."""
    from tvmfuse.schedules.cpu import _blocked

    model = api.import_model("tiny-resnet")
    database = tmp_path / TARGET.key
    choose = _blocked.choose_tile

    def one_by_one(rows, cols, vector, **kwargs):
        tile = choose(rows, cols, vector, **kwargs)
        return None if tile is None else _blocked.Tile(1, 1, tile.lanes)

    with monkeypatch.context() as patched:
        patched.setattr(_blocked, "choose_tile", one_by_one)
        api.tune(model, TARGET, api.BuildOptions(database=database), trials=0)

    def tiles(options):
        mod, analysis = api.analyze(model, TARGET, options, until="schedule")
        convs = sorted(k for k, v in analysis.implementations.items() if v.endswith("cpu.conv2d"))
        return {k: analysis.implementations[k] for k in convs}, {
            k: "T.unroll(T.int64(1))" in mod[k].script() or "T.unroll(1)" in mod[k].script()
            for k in convs}

    implementations, one_row = tiles(api.BuildOptions(database=database))
    assert implementations and all(v == "seed:cpu.conv2d" for v in implementations.values())
    fresh_implementations, fresh_one_row = tiles(api.BuildOptions(use_database=False))
    assert one_row == fresh_one_row  # the tiles the rule gives now, not the recorded ones
    compiled = api.compile_model(model, TARGET, api.BuildOptions(database=database))
    verify(api.load(api.build(compiled, tmp_path / "out")), model)
