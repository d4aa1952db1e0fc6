"""The ``tvmfuse`` command: one module per subcommand, each parsing and validating only."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import warnings

from .. import __version__, env
from ..errors import TvmfuseError
from . import arm_host, bench, build, db, inspect, run, tune

SUBCOMMANDS = (build, run, inspect, bench, tune, db, arm_host)

log = logging.getLogger("tvmfuse")


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (the README's promise for every bad input), naming
    the help to read instead of printing the usage."""

    def error(self, message: str):
        self.exit(2, f"ERROR tvmfuse: {self.prog}: {message} (see `{self.prog} --help`)\n")


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
    # SIGTERM (a scheduler's kill, a closed terminal) unwinds like Ctrl-C: a tuning job merges
    # what it measured, a build removes its half-written folder
    _stopped.clear()
    try:
        previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:  # main() called from a thread that is not the main one
        previous = {}
    try:
        return args.handler(args) or 0
    except KeyboardInterrupt:
        log.error("interrupted%s", f" ({_stopped[0]})" if _stopped else "")
        return 130
    except TvmfuseError as err:
        log.debug("details", exc_info=True)
        log.error("%s", err)
        _end_if_cuda_context_lost(2)
        return 2
    except OSError as err:  # a file the user named: unreadable, a full disk, no permission
        log.debug("details", exc_info=True)
        where = f" {err.filename}" if err.filename else ""
        log.error("cannot use%s: %s", where, err.strerror or err)
        return 2
    except Exception as err:
        # the signal arrived inside a TVM call, which hands Python's exception back as its own
        # (RuntimeError: SIGTERM): still an interruption, and the cleanup above has run
        if _stopped:
            log.debug("details", exc_info=True)
            log.error("interrupted (%s)", _stopped[0])
            return 130
        from ..cuda_fault import describe  # noqa: PLC0415

        # a CUDA error raised where no build folder names the library (a peer's timer's
        # synchronisation): one line, the kernel when the error names it
        line = describe(err)
        if line is None:
            raise
        log.debug("details", exc_info=True)
        log.error("%s", line)
        _end_if_cuda_context_lost(2)
        return 2
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


#: The commands whose process ends as soon as their work is done (:func:`script`): they leave no
#: worker process, thread or open file behind (tune's and arm-host's pools and servers end in
#: their own cleanup, so they exit as Python does).
ENDS_AT_ONCE = ("build", "run", "inspect", "bench")


def script() -> None:
    """The ``tvmfuse`` command (``python -m tvmfuse`` too): :func:`main`, then for
    :data:`ENDS_AT_ONCE` the process ends without tearing down what the run made: freeing
    PyTorch's and TVM's objects, the model's weights among them, took 1.6 s after a BERT-base
    build on 2 Zen 4 cores (``python benchmarks/build_time.py``: the wall time less the build's
    own total)."""
    argv = sys.argv[1:]
    code = main(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in ENDS_AT_ONCE:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _end_if_cuda_context_lost(code: int) -> None:
    """End the process with ``code`` at once where a CUDA error was reported: the lost context
    makes every free of device memory raise, and TVM's deleters then end the process in
    std::terminate ("terminate called after throwing an instance of 'tvm::ffi::Error'") after
    the error line, with a core dump's exit status."""
    fault = sys.modules.get("tvmfuse.cuda_fault")  # imported only where a CUDA error was seen
    if fault is not None and fault.LOST:
        logging.shutdown()
        sys.stdout.flush()
        os._exit(code)


#: The signal that stopped this run, once one has.
_stopped: list[str] = []


def _interrupt(signum, _frame):
    _stopped.append(signal.Signals(signum).name)
    tune = sys.modules.get("tvmfuse.tuning.tune")  # loaded only when a job can be running
    if tune is not None and tune.stop_jobs():
        # every record is on disk and now merged: end here rather than unwind through
        # MetaSchedule's C++ threads
        log.error("interrupted (%s)", _stopped[0])
        logging.shutdown()
        os._exit(130)
    raise KeyboardInterrupt(_stopped[0])


if __name__ == "__main__":
    script()
