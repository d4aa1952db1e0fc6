"""``tvmfuse bench``: latency of tvmfuse next to stock TVM, PyTorch (eager, torch.compile, with
freezing), ONNX Runtime (float32 and static int8) and OpenVINO (float32 and its own precision), in
one process, on identical inputs, in interleaved rounds."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path

from .. import env
from ..bench.engines import ENGINES, check_names
from ..errors import TvmfuseError
from .common import (
    DTYPES,
    add_database_arguments,
    add_model_arguments,
    build_options,
    check_model_arguments,
    check_output_file,
    import_arguments,
    positive_float,
    positive_int,
)

log = logging.getLogger(__name__)
#: float32 -> fp32 ...: how the table names a precision ("int8" names itself).
_SHORT = {precision: short for short, precision in DTYPES.items()}


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "bench", help="time tvmfuse against PyTorch, ONNX Runtime, OpenVINO and stock TVM",
        description=__doc__)
    add_model_arguments(parser)
    parser.add_argument("--batch", type=positive_int, metavar="N",
                        help="batch size (axis 0 of every input)")
    parser.add_argument("--engines", default=",".join(ENGINES), metavar="LIST",
                        help=f"comma-separated engines (default: all of {','.join(ENGINES)})")
    parser.add_argument("--repeat", type=positive_int, default=20, metavar="N",
                        help="timed runs per engine (default 20)")
    parser.add_argument("--max-seconds", type=positive_float, default=60.0, metavar="S",
                        help="stop timing a slow engine after S seconds, but not before 3 runs "
                             "(default 60)")
    parser.add_argument("--threads", type=positive_int, metavar="N",
                        help="threads for every engine (default: the target's num-cores)")
    add_database_arguments(parser, "the TVM engines")
    parser.add_argument("--peak", action="store_true",
                        help="measure the machine's peak (fp32 FMAs; bf16 on AVX-512 BF16: its "
                             "pair dot product) and report each engine's share")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the report as JSON")
    parser.add_argument("--plot", type=Path, metavar="OUT.png", help="write a bar chart")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    engines = check_names([e.strip() for e in args.engines.split(",") if e.strip()])
    check_model_arguments(args)
    if args.json is not None:
        check_output_file(args.json, "--json")
    if args.plot is not None:
        _require_matplotlib()
    env.short_openmp_spin()  # torch is not imported yet
    from .. import api  # noqa: PLC0415 - torch and TVM: only once the arguments are checked
    target = api.get_target(args.target)
    reason = target.why_not_runnable()
    if reason:
        raise TvmfuseError(f"cannot benchmark {target.name} here: {reason}")
    threads = args.threads or target.config.get("num-cores") or 1  # CPU threads (TVM host, torch)
    model = api.import_model(args.model, batch=args.batch, **import_arguments(args))
    report = api.bench(
        model, target, engines,
        options=build_options(args),
        threads=threads, repeat=args.repeat, max_seconds=args.max_seconds, peak=args.peak,
        dtype=DTYPES[args.dtype],
    )
    report.command = "tvmfuse " + shlex.join(sys.argv[1:])
    _print_table(report)
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        log.info("wrote %s", args.json)
    if args.plot:
        _plot(report, args.plot)
        log.info("wrote %s", args.plot)
    return 0


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError:
        raise TvmfuseError("--plot needs matplotlib: pip install 'tvmfuse[bench]'") from None


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _print_table(report) -> None:
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    peak = f", peak {report.peak_gflops:.0f} GFLOP/s" if report.peak_gflops else ""
    table = Table(title=f"{report.model} on {report.target}, {report.threads} threads, "
                        f"{report.dtype}{peak}, timed by {report.timer}")
    columns = ["engine", "median ms", "min ms", "max ms", "runs", "vs best peer", "GFLOP/s",
               "of peak", "setup s", "rel err", "agreement", "kernels"]
    for column in columns:
        table.add_column(column, justify="left" if column == "engine" else "right")
    for r in sorted(report.results, key=lambda r: r.median_ms):
        # an engine computing in a precision of its own says which (OpenVINO's bf16)
        short = _SHORT.get(r.precision, r.precision)
        own = r.precision and r.precision != report.dtype and short not in r.engine
        table.add_row(
            r.engine + (f" ({short})" if own else ""),
            f"{r.median_ms:.2f}", f"{r.min_ms:.2f}", f"{r.max_ms:.2f}", str(r.runs),
            _fmt(r.ratio_to_best_peer, ".2f") + ("x" if r.ratio_to_best_peer else ""),
            _fmt(r.gflops, ".1f"), _fmt(r.fraction_of_peak, ".0%"), f"{r.setup_s:.1f}",
            _fmt(r.rel_err, ".1e"), _agreement(r.agreement), _fmt(r.kernels, "d"),
        )
    console = Console()
    console.width = max(console.width, 144)  # a pipe reports 80 columns; the table needs more
    console.print(table)


def _agreement(agreement: dict[str, float] | None) -> str:
    """A quantized engine's agreement with the float32 reference (top-1 share or cosine)."""
    if not agreement:
        return "-"
    if "top1" in agreement:
        return f"top-1 {agreement['top1']:.0%}"
    return f"cos {agreement['cosine']:.4f}"


def _plot(report, path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from ..bench.report import OWN  # noqa: PLC0415

    results = sorted(report.results, key=lambda r: r.median_ms)
    names = [r.engine for r in results]
    medians = [r.median_ms for r in results]
    errors = [[r.median_ms - r.min_ms for r in results], [r.max_ms - r.median_ms for r in results]]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(results) + 1.5))
    colors = ["tab:orange" if n == "tvmfuse" else "tab:olive" if n in OWN else "tab:blue"
              for n in names]
    ax.barh(names, medians, xerr=errors, color=colors, capsize=3)
    ax.set_xscale("log" if max(medians) / min(medians) > 20 else "linear")
    ax.invert_yaxis()
    ax.set_xlabel("latency, ms (median; bars span min to max)")
    ax.set_title(f"{report.model} on {report.target}, {report.threads} threads, {report.dtype}")
    for y, r in enumerate(results):
        ax.text(r.max_ms, y, f"  {r.median_ms:.1f}", va="center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
