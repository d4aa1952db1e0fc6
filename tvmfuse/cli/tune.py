"""``tvmfuse tune``: tune a model's fused kernels with MetaSchedule into your database of the
target (``$TVMFUSE_TUNING_LOGS/<target-key>/``), which ``tvmfuse build`` then applies over the
one shipped with tvmfuse."""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

from .. import env
from ..errors import TvmfuseError
from .common import (
    add_model_arguments,
    add_rpc_argument,
    build_options,
    check_model_arguments,
    check_rpc,
    check_writable,
    import_arguments,
    nonnegative_int,
    positive_int,
)

log = logging.getLogger(__name__)

#: Searched candidates without --trials: 64, or with --budget as many as it allows (the plan
#: gives them to the kernels in proportion to their time; the budget stops the search).
DEFAULT_TRIALS, BUDGET_TRIALS = 64, 100_000


def add_parser(sub) -> None:
    parser = sub.add_parser("tune", help="tune the fused kernels into a tuning database",
                            description=__doc__)
    add_model_arguments(parser)
    parser.add_argument("--trials", type=nonnegative_int, metavar="N",
                        help="searched candidates in all, over the searched tasks (default 64, "
                             "or as many as --budget allows when it is given; 0: seed every "
                             "kernel with its hand-written schedule only)")
    parser.add_argument("--top-k", type=positive_int, metavar="K",
                        help="search only the K kernels that take the most time")
    parser.add_argument("--budget", type=_duration, metavar="TIME",
                        help="wall-clock budget, e.g. 45m, 2h, 600s: the search stops before it")
    parser.add_argument("--trials-per-iter", type=positive_int, default=4, metavar="K",
                        help="candidates per task per round (default 4)")
    parser.add_argument("--db", type=Path, metavar="DIR",
                        help="database folder (default: your own database of the target, in "
                             "$TVMFUSE_TUNING_LOGS or ~/.cache/tvmfuse/tuning_logs)")
    add_rpc_argument(parser, "measure (candidates are linked here)")
    parser.add_argument("--retune", action="store_true",
                        help="search again for tasks the database already holds")
    parser.add_argument("--no-compare", dest="compare", action="store_false",
                        help="after a search, do not time the model built without and with the "
                             "database (two builds and 20 interleaved runs each)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    check_model_arguments(args, db_must_exist=False)
    options = build_options(args)
    if args.db is not None and args.db.exists() and not args.db.is_dir():
        raise TvmfuseError(f"--db {args.db} is a file, not a database folder")
    if args.db is None:  # the user's database, made under TVMFUSE_TUNING_LOGS
        check_writable(env.TUNING_LOGS, "TVMFUSE_TUNING_LOGS")
    else:
        check_writable(args.db, "--db")
    check_rpc(args.rpc)
    from .. import api  # noqa: PLC0415 - torch and TVM: only once the arguments are checked

    if not args.verbose:  # MetaSchedule's per-trial chatter; the progress bar and plan remain
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    target = api.get_target(args.target)
    model = api.import_model(args.model, **import_arguments(args))
    trials = args.trials
    if trials is None:
        trials = DEFAULT_TRIALS if args.budget is None else BUDGET_TRIALS
    database, _ = api.tune(model, target, options, trials=trials,
                           trials_per_iter=args.trials_per_iter, top_k=args.top_k,
                           budget_s=args.budget, retune=args.retune, rpc=args.rpc)
    if args.compare and trials and target.why_not_runnable() is None and args.rpc is None:
        from ..tuning.tune import compare  # noqa: PLC0415

        times = compare(model, target, options, database)
        log.info("model latency (median of %d interleaved runs): %.2f ms without the database, "
                 "%.2f ms with it (%+.1f%%)", times.repeat, times.untuned_ms, times.tuned_ms,
                 -100 * times.gain)
    dtype = "" if args.dtype == "fp32" else f" --dtype {args.dtype}"
    if args.calibrate is not None:  # the same ranges, so the same kernels the records are for
        dtype += f" --calibrate {args.calibrate}"
    log.info("build with it: tvmfuse build %s --target %s%s --db %s -o DIR", args.model,
             target.name, dtype, database)
    return 0


def _duration(text: str) -> float:
    """Seconds in "45m", "2h", "90s" or a plain number of seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 45m, 2h or 600s")
    return seconds
