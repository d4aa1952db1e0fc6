"""``tvmfuse inspect``: what the pipeline makes of a model: kernels and fusion groups."""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from .common import add_model_arguments


def add_parser(sub) -> None:
    parser = sub.add_parser("inspect", help="list the kernels and fusion groups of a model",
                            description=__doc__)
    add_model_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument("--dump-ir", type=Path, metavar="DIR",
                        help="write the IR after each pipeline phase into DIR")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from .. import api  # noqa: PLC0415

    target = api.get_target(args.target)
    model = api.import_model(args.model, input_shapes=args.input_shape, dynamic=args.dynamic)
    _, analysis = api.analyze(model, target, api.BuildOptions(dump_ir=args.dump_ir))
    report = {
        "model": model.source,
        "target": target.name,
        "kernels": len(analysis.kernels),
        "groups": [g.to_json() for g in analysis.groups],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    table = Table(title=f"{model.source} on {target.name}: {report['kernels']} kernel launches, "
                        f"{len(analysis.groups)} fused")
    table.add_column("fused ops")
    table.add_column("groups", justify="right")
    for ops, count in collections.Counter(" + ".join(g.ops) for g in analysis.groups).most_common():
        table.add_row(ops, str(count))
    Console().print(table)
    return 0
