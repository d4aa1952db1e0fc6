"""``tvmfuse build``: compile a model into a deployable folder (library + manifest.json)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from .. import env
from .common import add_database_arguments, add_model_arguments

log = logging.getLogger(__name__)


def add_parser(sub) -> None:
    parser = sub.add_parser("build", help="compile a model into a deployable library",
                            description=__doc__)
    add_model_arguments(parser)
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="DIR",
                        help="folder to write model.so and manifest.json into")
    add_database_arguments(parser, "the build")
    parser.add_argument("--verify", action="store_true",
                        help="check every output against PyTorch (or ONNX Runtime) after building")
    parser.add_argument("--rpc", metavar="HOST:PORT:KEY",
                        help="--verify on the device that registered KEY with the RPC tracker at "
                             "HOST:PORT (for targets that cannot run here, e.g. arm64)")
    parser.add_argument("--bench", action="store_true",
                        help="time the build next to the reference, side by side")
    parser.add_argument("--repeat", type=int, default=5, metavar="N",
                        help="timed runs per engine for --bench (default 5)")
    parser.add_argument("--dump-ir", type=Path, metavar="DIR",
                        help="write the IR after each pipeline phase into DIR")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    if args.bench:
        env.short_openmp_spin()  # before torch is imported
    from .. import api  # noqa: PLC0415 - keep `tvmfuse --help` fast
    from ..errors import TvmfuseError  # noqa: PLC0415

    if args.repeat < 1:
        raise TvmfuseError("--repeat must be at least 1")
    if args.rpc and (args.bench or not args.verify):
        raise TvmfuseError("--rpc goes with --verify (time a remote build with `tvmfuse run DIR "
                           "--rpc ... --check --repeat N`)")
    target = api.get_target(args.target)
    model = api.import_model(args.model, input_shapes=args.input_shape, dynamic=args.dynamic)
    options = api.BuildOptions(database=args.db, use_database=not args.no_db, dump_ir=args.dump_ir,
                               fusion_rules=args.fusion_rules, verify_fusion=args.verify_fusion)
    out = api.build(api.compile_model(model, target, options), args.output)
    if not (args.verify or args.bench):
        return 0
    deployed = api.load(out, args.rpc)
    if args.verify:
        from ..verify import verify  # noqa: PLC0415

        checks = verify(deployed, model)
        worst = max(checks, key=lambda c: c.rel_err)
        log.info("verified %d output(s) against %s: worst relative L2 error %.2e (%s)",
                 len(checks), model.reference_name, worst.rel_err, worst.name)
    if args.bench:
        _bench(deployed, model, target, args.repeat)
    return 0


def _bench(deployed, model, target, repeat: int) -> None:
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    from ..bench import measure  # noqa: PLC0415

    engines = {"tvmfuse": deployed.runner(model.example_inputs)}
    if model.reference is not None:
        if model.reference_name == "pytorch":
            import torch  # noqa: PLC0415

            torch.set_num_threads(target.config.get("num-cores", torch.get_num_threads()))
        engines[model.reference_name] = lambda: model.reference(*model.example_inputs)
    log.info("timing %s: %d interleaved rounds after a warm-up", ", ".join(engines), repeat)
    results = measure(engines, repeat=repeat)
    base = results[-1].median_ms
    table = Table(title=f"{model.source} on {target.name}, "
                        f"{target.config.get('num-cores', '?')} threads, {repeat} runs each")
    for column in ("engine", "median ms", "min ms", "max ms", f"speedup vs {results[-1].engine}"):
        table.add_column(column, justify="left" if column == "engine" else "right")
    for r in results:
        table.add_row(r.engine, f"{r.median_ms:.2f}", f"{r.min_ms:.2f}", f"{r.max_ms:.2f}",
                      f"{base / r.median_ms:.2f}x")
    Console().print(table)
