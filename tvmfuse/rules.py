"""The fusion rules file: which fusions run, in what order, how large, per target.

A TOML file with a ``[default]`` table and optional per-target tables (``[avx512]``, ``[avx2]``,
``[x86-64]``, ``[arm64]``, ``[cuda]``) whose entries override the defaults for that target, like
CANN's fusion switch file but per target. Unknown rules, keys or sections are errors: a typo must
not silently turn a fusion off.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from .errors import TvmfuseError

#: Kinds of rule: tvmfuse's own fusion (what ``BuildOptions(fusion=False)`` turns off), a strategy
#: switch (which layout or computation an op gets), and TVM's FuseOps on what is left.
FUSION, STRATEGY, FUSE_OPS = "fusion", "strategy", "fuse_ops"


@dataclass(frozen=True)
class RuleInfo:
    """One rule as the registry declares it: its name in the rules file, its kind, and what it
    does (docs/fusion-rules.md's table of rules is this registry: a test keeps it so)."""

    name: str
    kind: str
    does: str


#: Every rule, once, in the order the rules file lists them.
REGISTRY = (
    RuleInfo("fold_batch_norm", FUSION, "BatchNorm folded into the conv's weights and bias"),
    RuleInfo("fold_matmul_reshape", FUSION, "the reshapes around a 2-D matmul folded: one N-D "
                                            "matmul"),
    RuleInfo("horizontal_matmul", FUSION, "matmuls sharing an input (Q, K, V) as one GEMM"),
    RuleInfo("horizontal_conv", FUSION, "two summed 1x1 convs (ResNet's downsample) as one conv "
                                        "over their concatenated inputs"),
    RuleInfo("fused_attention", FUSION, "head split .. softmax .. head merge as one kernel"),
    RuleInfo("fold_layout_glue", FUSION, "transposes and reshapes that move no data folded away"),
    RuleInfo("store_narrowed", STRATEGY, "fp16/bf16 builds: a float32 tensor the graph also "
                                         "narrows (a LayerNorm's output) stored once, narrowed "
                                         "(off on AVX-512: bf16's residual stream stays float32)"),
    RuleInfo("conv_layout_nhwc", STRATEGY, "convs in NHWC, weights HWIO on CPUs and OHWI on CUDA "
                                           "(an implicit GEMM on tensor cores)"),
    RuleInfo("fast_erf", STRATEGY, "CPU GELU's erf as a polynomial that vectorizes"),
    RuleInfo("fast_exp", STRATEGY, "CPU sigmoid (SiLU, quick GELU, gates) and tanh GELU as "
                                   "polynomials that vectorize"),
    RuleInfo("whole_vector_rows", STRATEGY, "CPU LayerNorm, RMSNorm and softmax reduced in "
                                            "vector accumulators, lanes folded in vectors"),
    RuleInfo("winograd_conv2d", STRATEGY, "CPU 3x3 stride-1 convs as Winograd F(2x2, 3x3)"),
    RuleInfo("space_to_depth_conv", STRATEGY, "strided fp16/bf16 convs over fewer than 8 input "
                                              "channels (a stem) as stride-1 convs over the "
                                              "input rearranged space-to-depth"),
    RuleInfo("cuda_graph", STRATEGY, "CUDA: the runs of kernels between statically planned "
                                     "allocations captured once as CUDA graphs and replayed"),
    RuleInfo("wgmma_gemm", STRATEGY, "CUDA: fp16/bf16 GEMMs and NHWC convs (implicit GEMM, "
             "channels % 8) of 1024 rows or more, K >= 128 (>= 64 at 16384 rows or more), over "
             "constant weights as Hopper wgmma kernels (TMA, warp-specialized), weights [N, K]"),
    RuleInfo("mma_gemm", STRATEGY, "CUDA: fp16/bf16 GEMMs over constant weights that wgmma does "
             "not take, on blocks of 64 x 64 or more, as the hand-written mma.sync kernel "
             "(swizzled shared memory, cp.async pipeline), weights [N, K]"),
    RuleInfo("prepack_weights", STRATEGY, "CPU conv/GEMM weights packed in panels of the "
                                          "register tile, at build time"),
    RuleInfo("conv_epilogue", FUSION, "conv + bias [+ residual] [+ activation]"),
    RuleInfo("matmul_epilogue", FUSION, "matmul + bias [+ residual] [+ activation]"),
    RuleInfo("layer_norm_epilogue", FUSION, "matmul + bias + residual + LayerNorm [+ casts]; "
             "CUDA: the wgmma kernel's epilogue, a row's tiles one cluster (off there: "
             "verified, no faster than the kernel pair, BERT b32 past the co-resident "
             "clusters)"),
    RuleInfo("add_layer_norm", FUSION, "residual add + LayerNorm"),
    RuleInfo("scale_mask_softmax", FUSION, "attention scores: scale, mask, softmax"),
    RuleInfo("head_matmul", FUSION, "unfused attention's batched matmuls with the head split "
                                    "they read Q and V through"),
    RuleInfo("elementwise", FUSE_OPS, "TVM's FuseOps on what the patterns left"),
)
RULES = tuple(r.name for r in REGISTRY)
#: The rules that are tvmfuse's own fusion (what ``BuildOptions(fusion=False)`` turns off).
FUSION_RULES = tuple(r.name for r in REGISTRY if r.kind == FUSION)
SECTIONS = ("default", "avx512", "avx2", "x86-64", "arm64", "cuda")
_KEYS = {"enabled": bool, "priority": int, "max_group_size": int}


@dataclass(frozen=True)
class Rule:
    name: str
    enabled: bool = True
    priority: int = 0
    max_group_size: int = 64


def markdown_table() -> str:
    """The registry as docs/fusion-rules.md's table of rules."""
    rows = ["| rule | kind | what it does |", "| --- | --- | --- |"]
    rows += [f"| `{r.name}` | {r.kind} | {r.does} |" for r in REGISTRY]
    return "\n".join(rows) + "\n"


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


def check_rules_file(path: Path) -> None:
    """A TvmfuseError where the fusion-rule file ``path`` cannot be read or is not valid: checked
    with the other arguments, before the model is imported."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise TvmfuseError(f"cannot read fusion rules {path}: {getattr(err, 'strerror', err)}") \
            from None
    _parse(str(path), text)


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
