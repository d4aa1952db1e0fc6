"""``tvmfuse build``: compile a model into a deployable folder (library + manifest.json). With
``--verify`` the folder replaces an earlier build only after the new one has been verified."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from .. import env
from ..errors import TvmfuseError
from .common import (
    add_database_arguments,
    add_model_arguments,
    add_rpc_argument,
    build_options,
    check_model_arguments,
    check_rpc,
    import_arguments,
    positive_int,
)

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
    add_rpc_argument(parser, "--verify (for targets that cannot run here, e.g. arm64)")
    parser.add_argument("--bench", action="store_true",
                        help="time the build next to the reference, side by side")
    parser.add_argument("--repeat", type=positive_int, default=5, metavar="N",
                        help="timed runs per engine for --bench (default 5)")
    parser.add_argument("--dump-ir", type=Path, metavar="DIR",
                        help="write the IR after each pipeline phase into DIR")
    parser.add_argument("--no-cache", action="store_true",
                        help="compile every CUDA binary afresh, without the kernel cache "
                             "(TVMFUSE_NO_CACHE=1 does so for every command)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    begun = time.perf_counter()
    if args.rpc and (args.bench or not args.verify):
        raise TvmfuseError("--rpc goes with --verify (time a remote build with `tvmfuse run DIR "
                           "--rpc ... --check --repeat N`)")
    check_model_arguments(args)
    options = build_options(args)
    from ..artifact import check_destination  # noqa: PLC0415 - light: before the heavy imports

    out = check_destination(args.output)
    check_rpc(args.rpc)
    from .. import reuse  # noqa: PLC0415 - light: the keys' digests import TVM when they need it

    early_key = None
    if options.cache and options.dump_ir is None:
        early_key = reuse.source_key(args.model, import_arguments(args), args.target, options)
    if early_key is not None and not (args.verify or args.bench) and \
            reuse.unchanged(out, early_key, field="source_key"):
        return _keep(out, begun)
    if args.bench:
        env.short_openmp_spin()  # before torch is imported
    from .. import api  # noqa: PLC0415 - torch and TVM: once the arguments are checked
    from ..buildtime import BuildTimes  # noqa: PLC0415
    from ..verify import record, verify, verify_agreement  # noqa: PLC0415

    target = api.get_target(args.target)
    reason = target.why_not_runnable()
    if (args.verify or args.bench) and args.rpc is None and reason is not None:
        raise TvmfuseError(f"cannot {'verify' if args.verify else 'time'} a {target.name} build "
                           f"here: {reason}; verify on its device with --rpc HOST:PORT:KEY")
    times = BuildTimes(started=begun)
    times.add("startup", time.perf_counter() - begun)
    with times.measure("import"):
        model = api.import_model(args.model, **import_arguments(args))
    key = None
    if options.cache and options.dump_ir is None:  # a dump asks for the pipeline to run
        with times.measure("reuse"):
            key = reuse.build_key(model, target, options)
    loaded = {}
    after = {}  # seconds of the checks after the build, for the report's line

    def check(staged: Path) -> None:  # the staged folder, before it replaces an earlier build
        start = time.perf_counter()
        loaded["deployed"] = deployed = api.load(staged, args.rpc)
        after["load"] = time.perf_counter() - start
        if args.verify:
            start = time.perf_counter()
            checks = verify(deployed, model)
            agreed = verify_agreement(deployed, model) if deployed.precision == "int8" else None
            record(staged, checks, model.reference_name, agreed)
            worst = max(checks, key=lambda c: c.rel_err)
            peer = "" if worst.peer_err is None else f"; {worst.peer} {worst.peer_err:.2e}"
            log.info("verified %d output(s) against %s: worst relative L2 error %.2e (%s%s)",
                     len(checks), model.reference_name, worst.rel_err, worst.name, peer)
            after["verify"] = time.perf_counter() - start

    if key is not None and reuse.unchanged(out, key):
        log.info("%s holds this build already (the same model, options, target, tuning records "
                 "and tvmfuse): kept it; --no-cache builds it again", out)
        if args.verify or args.bench:
            check(out)
        reuse.record_kept(out, times.to_json(), early_key)
    else:
        compiled = api.compile_model(model, target, options, times=times)
        compiled.build_key, compiled.source_key = key, early_key
        api.build(compiled, out, check=check if args.verify or args.bench else None)
    log.info("%s", times.line(after))
    if args.bench:
        _bench(loaded["deployed"], model, target, args.repeat)
    return 0


def _keep(out: Path, begun: float) -> int:
    """Keep ``out``, the build whose source key this command has, before the model's import."""
    from .. import reuse  # noqa: PLC0415

    seconds = round(time.perf_counter() - begun, 2)
    reuse.record_kept(out, {"total": seconds, "stages": {"reuse": seconds}})
    log.info("%s holds this build already (the same model source, options, target, tuning "
             "records and tvmfuse): kept it in %.1f s; --no-cache builds it again", out, seconds)
    return 0


def _bench(deployed, model, target, repeat: int) -> None:
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    from ..bench.session import against_reference  # noqa: PLC0415

    results = against_reference(deployed, model, target, repeat)
    base = results[-1].median_ms
    table = Table(title=f"{model.source} on {target.name}, "
                        f"{target.config.get('num-cores', '?')} threads, {repeat} runs each")
    for column in ("engine", "median ms", "min ms", "max ms", f"speedup vs {results[-1].engine}"):
        table.add_column(column, justify="left" if column == "engine" else "right")
    for r in results:
        table.add_row(r.engine, f"{r.median_ms:.2f}", f"{r.min_ms:.2f}", f"{r.max_ms:.2f}",
                      f"{base / r.median_ms:.2f}x")
    Console().print(table)
