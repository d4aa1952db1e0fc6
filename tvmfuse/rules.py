"""The fusion rules file: which fusions run, in what order, how large, per target.

A TOML file with a ``[default]`` table and optional per-target tables (``[avx512]``, ``[x86-64]``,
``[arm64]``, ``[cuda]``) whose entries override the defaults for that target, like CANN's fusion
switch file but per target. Unknown rules, keys or sections are errors: a typo must not silently
turn a fusion off.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from .errors import TvmfuseError

RULES = ("fold_batch_norm", "fold_matmul_reshape", "horizontal_matmul", "horizontal_conv",
         "fused_attention", "fold_layout_glue", "conv_layout_nhwc", "fast_erf", "winograd_conv2d",
         "prepack_weights", "conv_epilogue", "matmul_epilogue", "layer_norm_epilogue",
         "add_layer_norm", "scale_mask_softmax", "elementwise")
#: The rules that are tvmfuse's own fusion (what ``BuildOptions(fusion=False)`` turns off); the
#: others choose layouts and computations (conv_layout_nhwc, fast_erf, winograd_conv2d,
#: prepack_weights) or are
#: TVM's FuseOps (elementwise).
FUSION_RULES = ("fold_batch_norm", "fold_matmul_reshape", "horizontal_matmul", "horizontal_conv",
                "fused_attention", "fold_layout_glue", "conv_epilogue", "matmul_epilogue",
                "layer_norm_epilogue", "add_layer_norm", "scale_mask_softmax")
SECTIONS = ("default", "avx512", "x86-64", "arm64", "cuda")
_KEYS = {"enabled": bool, "priority": int, "max_group_size": int}


@dataclass(frozen=True)
class Rule:
    name: str
    enabled: bool = True
    priority: int = 0
    max_group_size: int = 64


def load_rules(section: str, path: Path | None = None) -> dict[str, Rule]:
    """The rules for target ``section``: the shipped defaults, then ``path``'s entries over them,
    each file's ``[default]`` first and its ``[section]`` after."""
    if section not in SECTIONS:
        raise ValueError(f"unknown rules section {section!r}")
    rules = {name: Rule(name) for name in RULES}
    shipped = resources.files("tvmfuse").joinpath("fusion_rules.toml").read_text()
    sources = [("the shipped rules", shipped)]
    if path is not None:
        try:
            sources.append((str(path), Path(path).read_text()))
        except OSError as err:
            raise TvmfuseError(f"cannot read fusion rules {path}: {err.strerror}") from None
    for origin, text in sources:
        tables = _parse(origin, text)
        for table in ("default", section):
            for name, entry in tables.get(table, {}).items():
                rules[name] = replace(rules[name], **entry)
    return rules


def _parse(origin: str, text: str) -> dict[str, dict[str, dict]]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise TvmfuseError(f"fusion rules {origin} are not valid TOML: {err}") from None
    for section, entries in data.items():
        if section not in SECTIONS:
            raise TvmfuseError(
                f"fusion rules {origin}: unknown section [{section}]; use {', '.join(SECTIONS)}"
            )
        for name, entry in entries.items():
            if name not in RULES:
                raise TvmfuseError(
                    f"fusion rules {origin}: unknown rule {name!r} in [{section}]; "
                    f"rules are {', '.join(RULES)}"
                )
            if not isinstance(entry, dict):
                raise TvmfuseError(f"fusion rules {origin}: [{section}] {name} must be a table")
            for key, value in entry.items():
                kind = _KEYS.get(key)
                if kind is None or type(value) is not kind:
                    raise TvmfuseError(
                        f"fusion rules {origin}: [{section}] {name}.{key} = {value!r} is not "
                        f"one of enabled (bool), priority (int), max_group_size (int)"
                    )
                if key == "max_group_size" and value < 1:
                    raise TvmfuseError(
                        f"fusion rules {origin}: [{section}] {name}.max_group_size must be >= 1"
                    )
    return data
