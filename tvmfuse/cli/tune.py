"""``tvmfuse tune``: tune a model's fused kernels with MetaSchedule into the target's database
(``tuning_logs/<target-key>/``), which ``tvmfuse build`` then applies."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ..errors import TvmfuseError
from .common import add_model_arguments

log = logging.getLogger(__name__)


def add_parser(sub) -> None:
    parser = sub.add_parser("tune", help="tune the fused kernels into a tuning database",
                            description=__doc__)
    add_model_arguments(parser)
    parser.add_argument("--trials", type=int, default=64, metavar="N",
                        help="searched candidates in all, over the searched tasks (default 64; "
                             "0: seed every kernel with its hand-written schedule only)")
    parser.add_argument("--top-k", type=int, metavar="K",
                        help="search only the K kernels that take the most time")
    parser.add_argument("--budget", type=_duration, metavar="TIME",
                        help="wall-clock budget, e.g. 45m, 2h, 600s: the search stops before it")
    parser.add_argument("--trials-per-iter", type=int, default=4, metavar="K",
                        help="candidates per task per round (default 4)")
    parser.add_argument("--db", type=Path, metavar="DIR",
                        help="database folder (default: tuning_logs/<target-key>/)")
    parser.add_argument("--rpc", metavar="HOST:PORT:KEY",
                        help="measure on the device that registered KEY with the RPC tracker at "
                             "HOST:PORT (candidates are linked here)")
    parser.add_argument("--retune", action="store_true",
                        help="search again for tasks the database already holds")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from .. import api  # noqa: PLC0415

    if args.trials < 0 or args.trials_per_iter < 1:
        raise TvmfuseError("--trials must be at least 0 and --trials-per-iter at least 1")
    if args.top_k is not None and args.top_k < 1:
        raise TvmfuseError("--top-k must be at least 1")
    if not args.verbose:  # MetaSchedule's per-trial chatter; the progress bar and plan remain
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    target = api.get_target(args.target)
    model = api.import_model(args.model, input_shapes=args.input_shape, dynamic=args.dynamic)
    options = api.BuildOptions(database=args.db, fusion_rules=args.fusion_rules)
    database, _ = api.tune(model, target, options, trials=args.trials,
                           trials_per_iter=args.trials_per_iter, top_k=args.top_k,
                           budget_s=args.budget, retune=args.retune, rpc=args.rpc)
    log.info("build with it: tvmfuse build %s --target %s --db %s -o DIR", args.model,
             target.name, database)
    return 0


def _duration(text: str) -> float:
    """Seconds in "45m", "2h", "90s" or a plain number of seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 45m, 2h or 600s") \
            from None
