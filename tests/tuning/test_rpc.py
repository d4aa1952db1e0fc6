"""Tuning through TVM's RPC tracker and server on loopback: the path a board takes."""

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tvmfuse import TvmfuseError, api
from tvmfuse.tuning import database

from conftest import HOST

TARGET = api.get_target(HOST)
KEY = "tvmfuse-loopback"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tracker(servers: int):
    """An RPC tracker and ``servers`` rpc_servers registered with it under KEY, all on
    127.0.0.1 (each given a one-port range: their default range ends at 9199)."""
    from tvm import rpc

    def start(*args):  # in its own process group: the worker each one forks goes with it
        return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)

    port = _free_port()
    procs = [start("tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                   "--port-end", str(port + 1))]
    time.sleep(2)
    for _ in range(servers):
        server_port = _free_port()
        procs.append(start("tvm.exec.rpc_server", "--host", "127.0.0.1", "--port",
                           str(server_port), "--port-end", str(server_port + 1), "--tracker",
                           f"127.0.0.1:{port}", "--key", KEY))
    try:
        for _ in range(60):
            if any(p.poll() is not None for p in procs):
                pytest.fail("the RPC tracker or a server exited at start")
            try:
                queue = rpc.connect_tracker("127.0.0.1", port).summary()["queue_info"]
                if queue.get(KEY, {}).get("free", 0) == servers:
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(1)
        else:
            pytest.fail("the RPC servers did not register with the tracker")
        yield f"127.0.0.1:{port}:{KEY}"
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def tracker():
    """An RPC tracker and one rpc_server registered with it."""
    yield from _tracker(1)


@pytest.fixture
def two_devices():
    """An RPC tracker and two rpc_servers under one key: two boards of one kind."""
    yield from _tracker(2)


@pytest.mark.slow  # 50 s; the arm tests (make test-arm, in CI) also search over RPC
def test_seeds_and_search_are_measured_over_rpc(tracker, tmp_path):
    db_dir = tmp_path / "db"
    model = api.import_model("tiny-resnet")
    _, plans = api.tune(model, TARGET, api.BuildOptions(database=db_dir), trials=4,
                        only=["fused_relax_nn_conv2d_relax_add_relax_nn_relu1"], rpc=tracker,
                        progress=False)
    (plan,) = [p for p in plans if p.seconds is not None]
    assert plan.trials == 4 and 0 < plan.seconds < 0.01
    db = database.read(db_dir)
    assert 1 <= len(db.records) <= 2  # the seed, and the candidate that beat it, if one did
    assert not db.problems
    (kept,) = (db_dir / "logs").glob("*/database_tuning_record.json")
    assert database.read(kept.parent).records  # the candidates timed over RPC


def test_candidates_are_timed_on_every_device_of_the_key_in_parallel(two_devices):
    """Two servers under one key: a batch of kernels is timed on both at once (the tracker
    lends both), each kernel's time comes back, and both devices are given back."""
    from tvm import te

    from tvmfuse import strategy
    from tvmfuse.remote import Remote
    from tvmfuse.tuning.measure import Timer

    def kernel(scale):
        x = te.placeholder((64, 64), name="x")
        return te.create_prim_func([x, te.compute((64, 64), lambda i, j: x[i, j] * scale,
                                                  name="y")])

    with Timer(TARGET.tvm_target(), strategy.for_target(TARGET).tir_pipeline(),
               remote=Remote.parse(two_devices)) as timer:
        seconds = timer.time_many([kernel(float(s)) for s in range(1, 5)])
        assert len(timer.sessions()) == 2 and _free(two_devices) == 0
        assert all(isinstance(s, float) and s > 0 for s in seconds), seconds
    deadline = time.monotonic() + 20
    while _free(two_devices) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _free(two_devices) == 2


def _free(tracker: str) -> int:
    """How many servers of the loopback key the tracker can lend now."""
    from tvm import rpc

    host, port, _ = tracker.rsplit(":", 2)
    return rpc.connect_tracker(host, int(port)).summary()["queue_info"][KEY]["free"]


def _given_back(tracker: str) -> bool:
    """Whether the server is free again within 20 s (it re-registers after a session ends)."""
    deadline = time.monotonic() + 20
    while _free(tracker) == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    return _free(tracker) == 1


# The tracker lends its one server to one session at a time: a session left open holds it
# until its timeout, and the next request waits for it (CI's arm tests did: `tvmfuse run --rpc`
# behind a loaded build, and the search's runner behind the seeds' session).

def test_a_closed_remote_build_gives_the_device_back(tracker, build_tiny):
    model, out = build_tiny("tiny-resnet")
    with api.load(out, tracker) as deployed:
        (output,) = deployed.run(model.example_inputs)
        assert _free(tracker) == 0
    (reference,) = model.reference(*model.example_inputs)
    np.testing.assert_allclose(output, reference, rtol=1e-4, atol=1e-5)
    assert _given_back(tracker)
    with pytest.raises(TvmfuseError, match="was closed.*load it again"):
        deployed.run(model.example_inputs)


def test_the_seeds_session_ends_before_the_search_asks_for_the_device(tracker):
    from tvm import te

    from tvmfuse import strategy
    from tvmfuse.remote import Remote
    from tvmfuse.tuning.measure import Timer

    x = te.placeholder((64, 64), name="x")
    func = te.create_prim_func([x, te.compute((64, 64), lambda i, j: x[i, j] * 2, name="y")])
    with Timer(TARGET.tvm_target(), strategy.for_target(TARGET).tir_pipeline(),
               remote=Remote.parse(tracker)) as measure:
        assert measure(func) > 0
        assert _free(tracker) == 0
    assert _given_back(tracker)


def test_a_missing_rpc_device_is_one_clear_error(tracker, tmp_path):
    host_port = tracker.rsplit(":", 1)[0]
    with pytest.raises(TvmfuseError, match="no RPC device 'nobody'.*rpc_server --tracker"):
        api.tune(api.import_model("tiny-resnet"), TARGET,
                 api.BuildOptions(database=tmp_path / "db"), trials=0, rpc=f"{host_port}:nobody")
    with pytest.raises(TvmfuseError, match="is not HOST:PORT:KEY"):
        api.tune(api.import_model("tiny-resnet"), TARGET, api.BuildOptions(), trials=0,
                 rpc="localhost")
