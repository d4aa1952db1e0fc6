"""arm64 builds run and tuned over TVM RPC on the emulated arm64 host (`tvmfuse arm-host`).

The tests marked ``arm`` start the host (making its Debian root first when it is not cached:
about 4 minutes) and need root, debootstrap and qemu-user with binfmt_misc (`make arm-sysdeps`);
`make test-arm` runs them, and CI does after the default run. The rest run everywhere.
"""

import numpy as np
import pytest

from tvmfuse import TvmfuseError, api, arm_host, env
from tvmfuse.remote import Remote
from tvmfuse.tuning import database

from conftest import run_cli

ARM64 = api.get_target("arm64")


@pytest.fixture(scope="module")
def arm_rpc():
    reason = arm_host.why_unavailable()
    if reason:
        pytest.skip(f"no emulated arm64 host on this machine: {reason}")
    running = arm_host.up(port=9290)  # not the default port: a user's host may be up
    try:
        yield running.rpc
    finally:
        arm_host.down()


@pytest.mark.arm
def test_mobilenet_v2_built_for_arm64_runs_on_the_emulated_host_and_matches_pytorch(
        arm_rpc, tmp_path):
    model = api.import_model("mobilenet_v2")
    out = api.build(api.compile_model(model, ARM64, api.BuildOptions()), tmp_path / "mbv2")
    assert (out / "model.so").read_bytes()[:4] == b"\x7fELF"
    with api.load(out, arm_rpc) as deployed:  # the emulator serves one session at a time
        (output,) = deployed.run(model.example_inputs)
    (reference,) = model.reference(*model.example_inputs)
    rel_err = np.linalg.norm(output - reference) / np.linalg.norm(reference)
    assert rel_err < 1e-4
    # the deployment command, with no torch in its process, against the saved reference
    result = run_cli("run", str(out), "--check", "--rpc", arm_rpc, "--repeat", "2",
                     "-o", str(tmp_path / "out.npz"))
    assert result.returncode == 0, result.stderr
    assert "relative L2 error" in result.stderr and "emulator" in result.stderr


@pytest.mark.arm
def test_an_int8_build_for_arm64_runs_on_the_emulated_host_within_int8_error(arm_rpc, tmp_path):
    """Calibrated here (the ranges are the model's), cross-compiled, run on the emulator: its
    integer sums (no VNNI there: the scalar tile) as this host's int8 build computes them."""
    model = api.import_model("tiny-resnet")
    out = api.build(api.compile_model(model, ARM64, api.BuildOptions(dtype="int8")),
                    tmp_path / "int8")
    with api.load(out, arm_rpc) as deployed:
        (output,) = deployed.run(model.example_inputs)
    (reference,) = model.reference(*model.example_inputs)
    assert np.linalg.norm(output - reference) / np.linalg.norm(reference) < 3e-2
    assert output.argmax() == reference.argmax()


@pytest.mark.arm
def test_a_short_tuning_run_over_rpc_on_the_emulated_host(arm_rpc, tmp_path, monkeypatch):
    monkeypatch.setattr(env, "TUNING_LOGS", tmp_path / "tuning_logs")
    db_dir, plans = api.tune(api.import_model("tiny-resnet"), ARM64, api.BuildOptions(),
                             trials=2, trials_per_iter=2,
                             only=["fused_relax_nn_conv2d_relax_add_relax_nn_relu1"],
                             rpc=arm_rpc, progress=False)
    # an emulator's records never land in the folder arm64 builds apply
    assert db_dir == tmp_path / "tuning_logs" / "arm64-neon-emulated"
    assert api.default_database(ARM64) is None
    (plan,) = [p for p in plans if p.seconds is not None]
    assert plan.trials == 2 and plan.seconds > 0
    # the kernel's schedule timed as the seed; the searched candidates kept beside, never applied
    # (one is recorded only where it verifiably beats the seed, which 2 trials need not find)
    db = database.read(db_dir)
    assert db.records and not db.problems
    (candidates,) = (db_dir / "logs").iterdir()
    searched = database.read(candidates)
    assert len(searched.records) == 2 and not searched.problems
    target = ARM64.tvm_target().export()
    assert all(database.same_target(d.target_of(r), target)
               for d in (db, searched) for r in d.records)


def test_keys_starting_with_qemu_are_emulators_and_get_longer_sessions():
    emulator, board = Remote.parse(f"127.0.0.1:9190:{arm_host.KEY}"), Remote.parse(
        "10.0.0.7:9190:rpi5")
    assert emulator.emulated and not board.emulated
    assert emulator.session_timeout > board.session_timeout
    assert emulator.runner_config().session_timeout_sec == emulator.session_timeout


def test_tuning_on_an_emulator_into_the_real_arm_database_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(env, "TUNING_LOGS", tmp_path)
    real = tmp_path / ARM64.key
    with pytest.raises(TvmfuseError, match="is an emulator.*leave --db out"):
        api.tune(api.import_model("tiny-resnet"), ARM64, api.BuildOptions(database=real),
                 trials=0, rpc=f"127.0.0.1:1:{arm_host.KEY}")


def test_an_arm64_build_run_here_names_the_rpc_fix(build_tiny):
    _, folder = build_tiny("tiny-resnet", "arm64")
    with pytest.raises(TvmfuseError, match="built for aarch64.*--rpc HOST:PORT:KEY"):
        api.load(folder)


def test_run_check_compares_with_the_reference_saved_at_build_time(build_tiny, tmp_path):
    model, folder = build_tiny("tiny-resnet")
    inputs, refs = api.load(folder).reference()
    np.testing.assert_array_equal(inputs[0], model.example_inputs[0])
    result = run_cli("run", str(folder), "--check", "-o", str(tmp_path / "out.npz"))
    assert result.returncode == 0, result.stderr
    assert "against the reference saved at build time" in result.stderr
    # a wrong saved reference fails the check with one clear error
    with np.load(folder / "check.npz") as saved:
        arrays = dict(saved)
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("model.so", "manifest.json"):
        (bad / name).write_bytes((folder / name).read_bytes())
    np.savez(bad / "check.npz", **{k: (v + 1 if k.startswith("output:") else v)
                                   for k, v in arrays.items()})
    result = run_cli("run", str(bad), "--check", "-o", str(tmp_path / "bad.npz"))
    assert result.returncode == 2 and "differs from the reference saved" in result.stderr


def test_named_arm_cores_carry_their_cpu_into_the_target_and_the_database_key():
    for name, mcpu in (("arm64-a72", "cortex-a72"), ("arm64-a76", "cortex-a76"),
                       ("arm64-n1", "neoverse-n1")):
        spec = api.get_target(name)
        assert spec.config["mcpu"] == mcpu and spec.key == f"arm64-{mcpu}"
        assert spec.cross_cc == "aarch64-linux-gnu-g++" and spec.vector.lanes == 4
    assert bool(api.get_target("arm64-a76").tvm_target().attrs["feature.has_dotprod"])
