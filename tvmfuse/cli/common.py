"""Arguments several subcommands share, and the checks every argument gets before anything heavy
(torch, TVM: 4-5 s to import) is loaded, so a mistyped argument costs no wait."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from .. import zoo
from ..errors import TvmfuseError
from ..options import BuildOptions
from ..rules import check_rules_file
from ..specs import CALIBRATION_SEEDS, DYNAMIC_DIMS, check_dynamic, parse_shape
from ..targets import check_name, host_target_name, target_names

#: --dtype -> the precision the kernels compute in (float32 everywhere but float16 storage in
#: a fp16 build; see tvmfuse.options.PRECISIONS).
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "int8"}

class _ListZoo(argparse.Action):
    """``--list``: print the zoo's names and what each is, and exit (like ``--version``, before
    the model argument is asked for; no torch imported)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(zoo.listing())
        parser.exit()


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        help="a zoo name (resnet50, vit, llama-decode, tiny-vit, ...: see --list), a .pt2 or "
        ".onnx file, or package.module:factory (also path/file.py:factory)",
    )
    parser.add_argument("--list", action=_ListZoo, help="list the zoo's model names and exit")
    parser.add_argument(
        "--input-shape", action="append", default=[], metavar="SHAPE[:DTYPE]",
        help="shape of one input, e.g. 1,3,224,224 or 1,128:int64; once per input, in order",
    )
    parser.add_argument(
        "--dynamic", action="extend", default=[], type=_dynamic_dims, metavar="DIMS",
        help="keep these dimensions symbolic, comma-separated: batch (axis 0 of every input), "
             "seq (axis 1 of integer inputs of two or more dimensions, token ids and masks; "
             "needs --max-seq)",
    )
    parser.add_argument("--max-seq", type=int, metavar="N",
                        help="the longest sequence a --dynamic seq build runs")
    parser.add_argument("--fusion-rules", type=Path, metavar="FILE",
                        help="fusion rules (TOML) over the shipped defaults; see fusion_rules.toml")
    parser.add_argument("--verify-fusion", action="store_true",
                        help="check each fused group against its ops run one by one; split back "
                             "any that fails to build or to match")
    host = host_target_name()
    parser.add_argument("--target", default=host,
                        help=f"one of {', '.join(target_names())} (default: {host}, this host's)")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES),
                        help="precision: fp32 (default), fp16 (TVM's ToMixedPrecision: "
                             "tensors in float16, matmuls and convs summing in float32; inputs "
                             "and outputs stay float32), bf16 (the same in bfloat16), or int8 "
                             "(GEMMs and convs quantized after a calibration run; see "
                             "--calibrate)")
    parser.add_argument("--calibrate", type=Path, metavar="NPZ",
                        help="int8: input sets to calibrate on, an .npz whose arrays are named "
                             "after the model's inputs with a leading axis of sets (default: "
                             f"{len(CALIBRATION_SEEDS)} seeded random draws, as --verify draws "
                             "its inputs)")


def _dynamic_dims(text: str) -> list[str]:
    dims = [d.strip() for d in text.split(",") if d.strip()]
    unknown = [d for d in dims if d not in DYNAMIC_DIMS]
    if unknown or not dims:
        raise argparse.ArgumentTypeError(
            f"unknown dimension {unknown[0] if unknown else text!r}; choose from "
            f"{', '.join(DYNAMIC_DIMS)} (comma-separated)")
    return dims


def import_arguments(args: argparse.Namespace) -> dict:
    """The keyword arguments of ``api.import_model`` that :func:`add_model_arguments` parsed."""
    return {"input_shapes": args.input_shape, "dynamic": args.dynamic, "max_seq": args.max_seq}


def build_options(args: argparse.Namespace) -> BuildOptions:
    """The build options the arguments ask for: what :func:`add_model_arguments` parsed, with
    ``--db``/``--no-db`` and ``--dump-ir`` where the command has them. One mapping for every
    command, so that ``tune`` tunes the kernels ``build`` builds from the same arguments."""
    return BuildOptions(database=getattr(args, "db", None),
                        use_database=not getattr(args, "no_db", False),
                        dump_ir=getattr(args, "dump_ir", None), fusion_rules=args.fusion_rules,
                        verify_fusion=args.verify_fusion, dtype=DTYPES[args.dtype],
                        cache=not getattr(args, "no_cache", False),
                        calibrate=getattr(args, "calibrate", None))


def add_database_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """``--db DIR | --no-db``: the tuning database ``what`` applies."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--db", type=Path, metavar="DIR",
                       help=f"tuning database {what} applies (default: the target's database "
                            f"of your own tuning runs, over the one shipped with tvmfuse)")
    group.add_argument("--no-db", action="store_true", help=f"{what} applies no tuning database")


def add_rpc_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--rpc HOST:PORT:KEY``: a device registered with TVM's RPC tracker."""
    parser.add_argument("--rpc", metavar="HOST:PORT:KEY",
                        help=f"{what} on the device that registered KEY with the RPC tracker at "
                             f"HOST:PORT")


def check_model_arguments(args: argparse.Namespace, db_must_exist: bool = True) -> None:
    """What can be known wrong about the model arguments without importing the model
    (``db_must_exist``: ``--db`` names a database to read, not one to create)."""
    check_name(args.target)
    check_dynamic(args.dynamic, args.max_seq)
    for text in args.input_shape:
        parse_shape(text)
    source = args.model
    path = Path(source)
    if path.suffix in (".pt2", ".onnx"):
        if not path.is_file():
            raise TvmfuseError(f"model file {source} does not exist")
    elif ":" in source:
        module, _, attr = source.rpartition(":")
        if not module or not attr.isidentifier():
            raise TvmfuseError(f"model {source!r} is not package.module:factory or "
                               f"path/file.py:factory")
        if module.endswith(".py") and not Path(module).is_file():
            raise TvmfuseError(f"cannot load model factory {source!r}: no file {module}")
    elif source not in zoo.registry():
        raise zoo.unknown(source)
    if args.fusion_rules is not None:
        check_rules_file(args.fusion_rules)
    if db_must_exist and getattr(args, "db", None) is not None and not args.db.is_dir():
        raise TvmfuseError(f"tuning database {args.db} does not exist; name a folder that holds "
                           f"one, or leave --db out")
    if getattr(args, "dump_ir", None) is not None:
        check_writable(args.dump_ir, "--dump-ir")


def check_writable(folder: Path, what: str) -> None:
    """A TvmfuseError when ``folder`` (made if missing) could not be written."""
    if folder.exists() and not folder.is_dir():
        raise TvmfuseError(f"{what} {folder} is a file, not a folder")
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TvmfuseError(f"{what} {folder}: cannot write into {existing} (permission denied)")


def check_output_file(path: Path, what: str) -> None:
    """A TvmfuseError when the file ``path`` could not be written: checked with the arguments,
    not after the work whose result it holds."""
    if path.is_dir():
        raise TvmfuseError(f"{what} {path} is a folder; name a file")
    if not path.parent.is_dir():
        raise TvmfuseError(f"{what} {path}: folder {path.parent} does not exist; create it or "
                           f"name a file in an existing folder")
    if not os.access(path.parent, os.W_OK | os.X_OK) or (path.exists()
                                                         and not os.access(path, os.W_OK)):
        raise TvmfuseError(f"{what} {path}: cannot write there (permission denied)")


def check_rpc(text: str | None) -> None:
    """``--rpc``: well formed, and a tracker listening there (within a few seconds)."""
    if text is None:
        return
    from ..remote import Remote  # noqa: PLC0415 - light, but only --rpc needs it

    Remote.parse(text).check_reachable()


def positive_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 1, "a whole number of at least 1")


def nonnegative_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 0, "a whole number of at least 0")


def positive_float(text: str) -> float:
    return _number(text, float, lambda v: math.isfinite(v) and v > 0, "a number above 0")


def _number(text: str, kind, ok, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value
