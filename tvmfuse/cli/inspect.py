"""``tvmfuse inspect``: what fusion buys. Kernels and bytes moved through memory for three
pipelines side by side (every op its own kernel, TVM's stock FuseOps, tvmfuse), and every group
tvmfuse fused, with the rule that fused it. ``--profile`` builds the model and times every kernel
on this machine: its implementation (tuned record, hand-written schedule, default), milliseconds
per run and GFLOP/s."""

from __future__ import annotations

import argparse
import collections
import json
from dataclasses import replace
from pathlib import Path

from .common import (
    add_database_arguments,
    add_model_arguments,
    build_options,
    check_model_arguments,
    import_arguments,
    positive_int,
)


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "inspect", help="compare kernels and bytes moved: unfused, stock, tvmfuse",
        description=__doc__)
    add_model_arguments(parser)
    parser.add_argument("--batch", type=positive_int, metavar="N",
                        help="batch size (axis 0 of every input)")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument("--dump-ir", type=Path, metavar="DIR",
                        help="write the IR after each pipeline phase into DIR")
    parser.add_argument("--profile", action="store_true",
                        help="build for this machine and time every kernel (implementation, ms, "
                             "GFLOP/s)")
    add_database_arguments(parser, "--profile")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    check_model_arguments(args)
    options = build_options(args)
    from .. import api  # noqa: PLC0415 - torch and TVM: only once the arguments are checked

    target = api.get_target(args.target)
    model = api.import_model(args.model, batch=args.batch, **import_arguments(args))
    # an int8 build calibrated once, for the analysis and the profile's build alike
    options = api.calibrated(model, target, options)
    report = api.benefit(model, target, options)
    if args.profile:  # the IR was dumped by the analysis above
        report["kernels"] = api.profile_kernels(model, target, replace(options, dump_ir=None))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    console = Console()
    console.width = max(console.width, 120)  # a pipe reports 80 columns
    unfused = report["pipelines"]["unfused"]
    table = Table(title=f"{model.source} on {target.name}")
    for column in ("pipeline", "kernels", "MB moved", "of unfused"):
        table.add_column(column, justify="left" if column == "pipeline" else "right")
    for name, summary in report["pipelines"].items():
        table.add_row(name, str(summary["kernels"]), f"{summary['bytes'] / 1e6:.1f}",
                      f"{summary['bytes'] / unfused['bytes']:.0%}")
    console.print(table)
    groups = Table(title="tvmfuse fusion groups")
    for column in ("rule", "ops", "output shapes", "count"):
        groups.add_column(column, justify="right" if column == "count" else "left")
    counts = collections.Counter((g["rule"], " + ".join(g["ops"])) for g in report["groups"])
    outputs = collections.defaultdict(dict)  # (rule, ops) -> output shapes, in order, once each
    for g in report["groups"]:
        outputs[g["rule"], " + ".join(g["ops"])]["x".join(map(str, g["output"]))] = None
    for (rule, ops), count in sorted(counts.items(), key=lambda item: (item[0][0], -item[1])):
        shapes = list(outputs[rule, ops])
        shown = ", ".join(shapes[:3]) + (f" (+{len(shapes) - 3})" if len(shapes) > 3 else "")
        groups.add_row(rule, ops, shown, str(count))
    console.print(groups)
    if args.profile:
        console.print(_kernel_table(report["kernels"]))
    return 0


def _kernel_table(kernels: list[dict]):
    from rich.table import Table  # noqa: PLC0415

    total = sum(k["ms"] for k in kernels)
    table = Table(title=f"kernels on this machine, slowest first ({total:.2f} ms in all, each "
                        f"timed alone)")
    for column in ("kernel", "implementation", "launches", "ms", "share", "GFLOP/s"):
        table.add_column(column, justify="left" if column in ("kernel", "implementation")
                         else "right")
    for k in kernels:
        table.add_row(k["kernel"], k["implementation"], str(k["launches"]), f"{k['ms']:.3f}",
                      f"{k['ms'] / total:.1%}" if total else "-",
                      "-" if k["gflops"] is None else f"{k['gflops']:.1f}")
    return table
