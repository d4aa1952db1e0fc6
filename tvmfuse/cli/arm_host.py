"""``tvmfuse arm-host``: an emulated arm64 Linux host on this machine (Debian root, qemu-user, TVM's
RPC server registered with a local tracker), to run and tune arm64 builds with ``--rpc``."""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def add_parser(sub) -> None:
    parser = sub.add_parser("arm-host", help="start or stop the emulated arm64 RPC host",
                            description=__doc__)
    parser.add_argument("action", choices=("up", "down", "status", "create"),
                        help="up: create the root when missing and start the tracker and server; "
                             "down: stop them; status: print the --rpc address if up; create: "
                             "(re)make the root only")
    parser.add_argument("--port", type=int, default=9190,
                        help="the tracker's port on 127.0.0.1 (default 9190)")
    parser.add_argument("--force", action="store_true", help="create: make the root again")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from .. import arm_host  # noqa: PLC0415

    if args.action == "create":
        arm_host.create(force=args.force)
    elif args.action == "up":
        print(arm_host.up(args.port).rpc)
    elif args.action == "down":
        arm_host.down()
    else:
        running = arm_host.status()
        if running is None:
            log.info("the arm64 host is not running (start it with `tvmfuse arm-host up`)")
            return 1
        print(running.rpc)
    return 0
