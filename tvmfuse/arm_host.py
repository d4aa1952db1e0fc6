"""An emulated arm64 Linux host on this machine, for running and tuning arm64 builds over TVM RPC.

``tvmfuse arm-host up`` makes, once, a minimal Debian arm64 root with ``debootstrap`` (Python 3.11
and the aarch64 apache-tvm wheel in ``/opt/tvm``), then starts an RPC tracker on 127.0.0.1 and
``python -m tvm.exec.rpc_server`` inside the root, which the kernel runs through qemu-user
(binfmt_misc). The server registers as :data:`KEY`; tvmfuse then reaches it exactly as it reaches
a real board: ``--rpc 127.0.0.1:PORT:qemu-arm64``.

Under emulation an aarch64 instruction costs whatever qemu makes it cost, so times measured there
say nothing about an ARM core: keys that start with ``qemu-`` mark an emulated device, and
tvmfuse keeps what it tunes there apart from real ARM records (see :mod:`tvmfuse.remote`).

Needs root (debootstrap, chroot), Debian's ``debootstrap`` and ``qemu-user-static`` with
binfmt_misc enabled for aarch64 (``make arm-sysdeps``). Measured here: the root takes about 4
minutes to create and 830 MB; later starts take seconds (the server imports TVM in about 7 s).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import env
from .errors import TvmfuseError

log = logging.getLogger(__name__)

#: The device key the emulated server registers; the ``qemu-`` prefix marks it as emulated.
KEY = "qemu-arm64"
SUITE = "bookworm"  # Debian 12: Python 3.11, glibc 2.36 (the aarch64 TVM wheel needs >= 2.28)
MIRROR = "http://deb.debian.org/debian"
#: What the root's Python gets, from PyPI's aarch64 wheels; the TVM pins match pyproject.toml.
REQUIREMENTS = ("apache-tvm==0.27.0.post1", "apache-tvm-ffi==0.1.14.post1", "numpy", "psutil",
                "cloudpickle")
PACKAGES = ("python3", "python3-venv", "libgomp1", "libstdc++6", "ca-certificates")
#: Written last into a finished root: what it holds (a root without it is not used).
READY = "tvmfuse-arm-host.json"
STATE = "running.json"
START_TIMEOUT_S = 180


@dataclass(frozen=True)
class Running:
    """A started host: the tracker's port and the two processes' ids."""

    tracker_port: int
    tracker_pid: int
    server_pid: int

    @property
    def rpc(self) -> str:
        """The address for ``--rpc``."""
        return f"127.0.0.1:{self.tracker_port}:{KEY}"


def root() -> Path:
    return env.ARM_HOST_DIR / "root"


def create(*, force: bool = False) -> Path:
    """The emulated root, made first when missing (or when ``force``); atomic: a root is only
    used once it is complete."""
    target = root()
    if _ready(target) and not force:
        return target
    _check()
    env.ARM_HOST_DIR.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix="root.partial-", dir=env.ARM_HOST_DIR))
    try:
        log.info("creating the arm64 root in %s (debootstrap %s, about 4 minutes)", partial, SUITE)
        _run(["debootstrap", "--arch=arm64", "--variant=minbase",
              f"--include={','.join(PACKAGES)}", SUITE, str(partial), MIRROR], "debootstrap")
        wheels = partial / "tmp" / "wheels"
        log.info("downloading the aarch64 wheels: %s", " ".join(REQUIREMENTS))
        _run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
              "--platform", "manylinux_2_28_aarch64", "--platform", "manylinux2014_aarch64",
              "--python-version", "3.11", "--implementation", "cp", "-d", str(wheels),
              *REQUIREMENTS], "pip download")
        log.info("installing them into /opt/tvm inside the root (emulated, about a minute)")
        _run(_chroot(partial, "/bin/sh", "-c",
                     "python3 -m venv /opt/tvm && /opt/tvm/bin/pip install -q --no-index "
                     f"--find-links /tmp/wheels {' '.join(REQUIREMENTS)}"), "pip install (arm64)")
        shutil.rmtree(wheels)
        (partial / READY).write_text(json.dumps(
            {"suite": SUITE, "requirements": list(REQUIREMENTS)}, indent=1))
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    log.info("arm64 root ready: %s", target)
    return target


def up(port: int = 9190) -> Running:
    """Start the tracker on 127.0.0.1:``port`` and the emulated server (creating the root first
    when needed); return the running host. A host already up is returned as it is."""
    running = status()
    if running is not None:
        return running
    _check()
    rootfs = create()
    log_path = env.ARM_HOST_DIR / "server.log"
    with open(log_path, "ab") as out:
        tracker = _spawn([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                          "--port", str(port), "--port-end", str(port + 1)], out)
        # the server reaps its session workers through psutil, which reads /proc: the root
        # gets its own, in a mount namespace that ends with the server
        server = _spawn(["unshare", "--mount", "--fork", f"--mount-proc={rootfs / 'proc'}",
                         *_chroot(rootfs, "/opt/tvm/bin/python", "-m", "tvm.exec.rpc_server",
                                  "--host", "127.0.0.1", "--port", str(port + 10),
                                  "--port-end", str(port + 20), "--tracker",
                                  f"127.0.0.1:{port}", "--key", KEY)], out)
    running = Running(port, tracker.pid, server.pid)
    (env.ARM_HOST_DIR / STATE).write_text(json.dumps(asdict(running)))
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _registered(port):
        if tracker.poll() is not None or server.poll() is not None or time.monotonic() > deadline:
            down()
            raise TvmfuseError(f"the emulated arm64 RPC server did not start; see {log_path}")
        time.sleep(1)
    log.info("arm64 host up: --rpc %s (emulated: its times say nothing about ARM speed)",
             running.rpc)
    return running


def status() -> Running | None:
    """The running host, or None (a stale state file is removed)."""
    state = env.ARM_HOST_DIR / STATE
    if not state.is_file():
        return None
    running = Running(**json.loads(state.read_text()))
    if _alive(running.tracker_pid) and _alive(running.server_pid) and \
            _registered(running.tracker_port):
        return running
    down()
    return None


def down() -> None:
    """Stop the tracker and the server, if they run."""
    state = env.ARM_HOST_DIR / STATE
    if not state.is_file():
        return
    running = Running(**json.loads(state.read_text()))
    for pid in (running.server_pid, running.tracker_pid):
        if _alive(pid):
            os.killpg(pid, signal.SIGTERM)
    state.unlink()


def _ready(rootfs: Path) -> bool:
    try:
        return json.loads((rootfs / READY).read_text())["requirements"] == list(REQUIREMENTS)
    except (OSError, ValueError, KeyError):
        return False


def why_unavailable() -> str | None:
    """Why this machine cannot run the emulated host, or None when it can."""
    if os.geteuid() != 0:
        return "it needs root (debootstrap and chroot)"
    tools = ["chroot", "unshare"] + ([] if _ready(root()) else ["debootstrap"])
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (`make arm-sysdeps`)"
    binfmt = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if not binfmt.is_file() or "enabled" not in binfmt.read_text():
        return ("aarch64 binaries do not run through qemu here: no binfmt_misc handler "
                "(`make arm-sysdeps`: qemu-user-static, binfmt-support, update-binfmts --enable "
                "qemu-aarch64)")
    return None


def _check() -> None:
    reason = why_unavailable()
    if reason:
        raise TvmfuseError(f"cannot run the emulated arm64 host: {reason}")


def _chroot(rootfs: Path, *command: str) -> list[str]:
    # a clean environment: this machine's PIP_* settings and paths mean nothing in the root
    return ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
            "chroot", str(rootfs), *command]


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise TvmfuseError(f"{what} failed (exit {result.returncode}): {' / '.join(tail)}")


def _spawn(command: list[str], out) -> subprocess.Popen:
    # its own session: the host outlives the command that started it, and stops as a group
    return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _registered(port: int) -> bool:
    from tvm import rpc  # noqa: PLC0415

    try:  # connect_tracker retries (and logs) while nothing listens: look first
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    try:
        return KEY in rpc.connect_tracker("127.0.0.1", port).summary()["queue_info"]
    except Exception:  # noqa: BLE001 - not listening yet, or gone
        return False
