"""Arguments several subcommands share."""

import argparse
from pathlib import Path

from ..specs import DYNAMIC_DIMS
from ..targets import target_names


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        help="a zoo name (resnet50, mobilenet_v2, bert-base, tiny-*), a .pt2 or .onnx file, "
        "or package.module:factory",
    )
    parser.add_argument(
        "--input-shape", action="append", default=[], metavar="SHAPE[:DTYPE]",
        help="shape of one input, e.g. 1,3,224,224 or 1,128:int64; once per input, in order",
    )
    parser.add_argument(
        "--dynamic", action="append", default=[], choices=sorted(DYNAMIC_DIMS),
        help="keep this dimension symbolic (batch: axis 0 of every input)",
    )
    parser.add_argument("--fusion-rules", type=Path, metavar="FILE",
                        help="fusion rules (TOML) over the shipped defaults; see fusion_rules.toml")
    parser.add_argument("--verify-fusion", action="store_true",
                        help="check each fused group against its ops run one by one; split back "
                             "any that fails to build or to match")
    parser.add_argument("--target", default="avx512",
                        help=f"one of {', '.join(target_names())} (default: avx512, this host)")


def add_database_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """``--db DIR | --no-db``: the tuning database ``what`` applies."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--db", type=Path, metavar="DIR",
                       help=f"tuning database {what} applies (default: tuning_logs/<target-key>/ "
                            f"when it holds records)")
    group.add_argument("--no-db", action="store_true", help=f"{what} applies no tuning database")
