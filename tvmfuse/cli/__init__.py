"""The ``tvmfuse`` command: one module per subcommand, each parsing and validating only."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

from .. import __version__, env
from ..errors import TvmfuseError
from . import arm_host, bench, build, db, inspect, run, tune

SUBCOMMANDS = (build, run, inspect, bench, tune, db, arm_host)

log = logging.getLogger("tvmfuse")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tvmfuse",
        description="Compile PyTorch and ONNX models with TVM Relax and tvmfuse's fusion passes.",
    )
    parser.add_argument("--version", action="version", version=f"tvmfuse {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in SUBCOMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else env.LOG_LEVEL,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    # torch.export's own deprecation notices say nothing to a tvmfuse user.
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.captureWarnings(True)
    try:
        return args.handler(args) or 0
    except TvmfuseError as err:
        log.debug("details", exc_info=True)
        log.error("%s", err)
        return 2
    except KeyboardInterrupt:
        log.error("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
