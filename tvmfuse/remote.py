"""Measuring on another machine through TVM's RPC tracker (``python -m tvm.exec.rpc_tracker``,
``python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY``): the address users give as
``--rpc HOST:PORT:KEY``, MetaSchedule's RPC runner config, and a builder export that
cross-links shared libraries on this machine (a remote board may have no compiler)."""

from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import dataclass

from . import env
from .errors import TvmfuseError, one_line

#: How long one RPC session with a device may last (a measurement, one candidate's runs, or
#: a deployed model's runs), and how many times longer on an emulator: qemu-user runs the
#: aarch64 code many times slower than a board. An emulated session that outlasts 120 s is
#: waiting for the device behind one of ours left open (see ``Deployed.close``).
SESSION_TIMEOUT_S = 120
EMULATOR_SLOWDOWN = 5
#: Device keys that start with this name an emulator (``tvmfuse arm-host`` registers
#: ``qemu-arm64``): what is measured there says nothing about the hardware's speed.
EMULATED_PREFIX = "qemu-"


@dataclass(frozen=True)
class Remote:
    host: str
    port: int
    key: str

    @classmethod
    def parse(cls, text: str) -> Remote:
        """``HOST:PORT:KEY`` (the tracker's address and the device key) or a TvmfuseError."""
        parts = text.rsplit(":", 2)
        if len(parts) != 3 or not parts[1].isdigit() or not parts[0] or not parts[2]:
            raise TvmfuseError(f"--rpc {text!r} is not HOST:PORT:KEY (the RPC tracker's host "
                               f"and port, and the key the device's rpc_server registered)")
        return cls(parts[0], int(parts[1]), parts[2])

    def __str__(self) -> str:
        return f"{self.host}:{self.port}:{self.key}"

    @property
    def emulated(self) -> bool:
        return self.key.startswith(EMULATED_PREFIX)

    @property
    def session_timeout(self) -> int:
        return SESSION_TIMEOUT_S * (EMULATOR_SLOWDOWN if self.emulated else 1)

    def runner_config(self):
        from tvm.s_tir import meta_schedule as ms  # noqa: PLC0415

        return ms.runner.RPCConfig(tracker_host=self.host, tracker_port=self.port,
                                   tracker_key=self.key, session_timeout_sec=self.session_timeout)

    def check_reachable(self) -> None:
        """A TvmfuseError within ``TVMFUSE_RPC_CONNECT_TIMEOUT`` seconds when nothing listens at
        the tracker's address (TVM's own connect retries for about a minute)."""
        try:
            socket.create_connection((self.host, self.port), timeout=env.RPC_CONNECT_TIMEOUT_S
                                     ).close()
        except OSError as err:
            raise TvmfuseError(
                f"no RPC tracker at {self.host}:{self.port} ({err.strerror or err} within "
                f"{env.RPC_CONNECT_TIMEOUT_S:g} s); {self._how_to_start()}") from None

    def _how_to_start(self) -> str:
        return (f"start `python -m tvm.exec.rpc_tracker --port {self.port}` and on the device "
                f"`python -m tvm.exec.rpc_server --tracker {self.host}:{self.port} --key "
                f"{self.key}`")

    def free_devices(self) -> int:
        """How many devices of this key the tracker can lend now (0 where it knows none)."""
        from tvm import rpc  # noqa: PLC0415

        self.check_reachable()
        try:
            queue = rpc.connect_tracker(self.host, self.port).summary().get("queue_info", {})
        except Exception:  # noqa: BLE001 - the session request names the problem
            return 0
        return int(queue.get(self.key, {}).get("free", 0))

    def session(self):
        """A session with a device of this key, or a TvmfuseError saying what to start."""
        from tvm import rpc  # noqa: PLC0415 - `tvmfuse run` stays light until it connects

        self.check_reachable()
        try:
            tracker = rpc.connect_tracker(self.host, self.port)
            # a request for a key no server registered would wait forever
            if self.key not in tracker.summary().get("queue_info", {}):
                raise RuntimeError(f"the tracker knows no device {self.key!r}")
            return tracker.request(self.key, priority=1, session_timeout=self.session_timeout)
        except Exception as err:  # noqa: BLE001 - socket and RPC errors alike: one line
            raise TvmfuseError(
                f"no RPC device {self.key!r} at tracker {self.host}:{self.port} "
                f"({one_line(err, 120)}); {self._how_to_start()}"
            ) from None


class SharedLibraryExport:
    """MetaSchedule builder export: a ``.so`` linked here, with ``cross_cc`` when given (the
    default export writes a ``.tar`` that the device would have to link itself)."""

    def __init__(self, cross_cc: str | None = None):
        self.cross_cc = cross_cc

    def __call__(self, module) -> str:
        from tvm.support import cc  # noqa: PLC0415

        path = os.path.join(tempfile.mkdtemp(prefix="tvmfuse-candidate-"), "kernel.so")
        fcompile = cc.cross_compiler(self.cross_cc) if self.cross_cc else None
        module.export_library(path, fcompile=fcompile)
        return path
