"""Epilogue fusion: an anchor op (conv2d, matmul) with the elementwise ops that follow it, and
for convs the layout glue that builds their input.

Each pattern is ``anchor [+ bias] [+ residual] [-> activation]``, where the bias is a constant
(as BatchNorm folding and linear layers leave it) and the residual any tensor; the variants are
named ``tvmfuse.<family>.<parts>`` (e.g. ``tvmfuse.conv_epilogue.bias_add_relu``) and longer
variants come first, so the largest epilogue wins. Activations are matched in the decomposed form
torch.export gives them (SiLU is ``x * sigmoid(x)``, hardswish ``x * clip(x + 3, 0, 6) / 6``).

A conv's data may come from a prologue in the same kernel (see :func:`conv_input`): the NHWC
transpose of a model's NCHW input, or the concatenation MergeSummedConv leaves (ResNet's block
output and its subsampled input); a matmul's from a row selection (:func:`matmul_input`). The
schedule builds it in its own loop nest before the anchor.
"""

from __future__ import annotations

from collections.abc import Callable

from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl import DFPattern, OrPattern, is_const, is_op, is_tuple, wildcard
from tvm.relax.transform import FusionPattern


def _clip(y: DFPattern) -> DFPattern:
    return is_op("relax.clip")(y, wildcard(), wildcard())


def _minmax(y: DFPattern) -> DFPattern:
    """A clip as DecomposeClip leaves it (on CPUs, before the NHWC layout)."""
    return is_op("relax.minimum")(is_op("relax.maximum")(y, is_const()), is_const())


def _hardswish(clip: Callable[[DFPattern], DFPattern]) -> Callable[[DFPattern], DFPattern]:
    def pattern(y: DFPattern) -> DFPattern:
        gate = clip(clip(is_op("relax.add")(y, is_const())))
        return is_op("relax.divide")(is_op("relax.multiply")(y, gate), is_const())

    return pattern


#: Activation name -> pattern of the activation applied to ``y`` (ReLU6 is a clip).
ACTIVATIONS: dict[str, Callable[[DFPattern], DFPattern]] = {
    "hardswish": _hardswish(_clip),
    "hardswish_minmax": _hardswish(_minmax),
    "minmax": _minmax,
    "silu": lambda y: is_op("relax.multiply")(y, is_op("relax.sigmoid")(y)),
    # CLIP's quick GELU, x * sigmoid(1.702 x)
    "quick_gelu": lambda y: is_op("relax.multiply")(
        y, is_op("relax.sigmoid")(is_op("relax.multiply")(y, is_const()))),
    "relu": lambda y: is_op("relax.nn.relu")(y),
    "clip": _clip,
    "gelu": lambda y: is_op("relax.nn.gelu")(y),
    "gelu_tanh": lambda y: is_op("relax.nn.gelu_tanh")(y),
    "sigmoid": lambda y: is_op("relax.sigmoid")(y),
    "tanh": lambda y: is_op("relax.tanh")(y),  # BERT's pooler
}

#: Anchor ops of each epilogue family.
ANCHORS = {"conv_epilogue": "relax.nn.conv2d", "matmul_epilogue": "relax.matmul"}


def conv_input() -> DFPattern:
    """Layout glue that may build a conv's data in the conv's kernel: a transpose (the model
    input's NCHW -> NHWC) or a concatenation of two tensors, each possibly strided
    (MergeSummedConv)."""
    def part() -> DFPattern:
        return is_op("relax.strided_slice")(wildcard(), varg_default_wildcard=True) | wildcard()

    concat = is_op("relax.concat")(is_tuple([part(), part()]))
    return concat | is_op("relax.permute_dims")(wildcard())


def matmul_input() -> DFPattern:
    """A matmul's data as one row (BERT's pooler reads the first token): ``take`` or a strided
    slice of its input."""
    return (is_op("relax.take")(wildcard(), is_const())
            | is_op("relax.strided_slice")(wildcard(), varg_default_wildcard=True))


#: Family -> the prologues its anchor's data may have, each tried before the plain anchor.
_PROLOGUES = {"conv_epilogue": (conv_input,), "matmul_epilogue": (matmul_input,)}


def epilogue_patterns(family: str, max_group_size: int, quantized: bool = False
                      ) -> list[FusionPattern]:
    """Every ``[prologue ->] anchor [+ bias] [+ residual] [-> activation]`` variant of
    ``family``, longest first (a variant with a prologue before the same one without it); a
    match holding more than ``max_group_size`` ops is rejected. ``quantized`` (an int8 build)
    reads the anchor's int32 sums dequantized and a residual stored quantized
    (:func:`dequantized`, :func:`dequantized_input`), and adds each variant followed by the
    quantization of its output for the next GEMM or conv (:func:`quantize`): the kernel writes
    uint8."""
    variants = []
    for bias in (True, False):  # bias first: where both fit an add, it is the constant bias
        for residual in (True, False):
            for act in (*ACTIVATIONS, None):
                if not (bias or residual or act):
                    continue  # the anchor alone is no fusion
                for tail in ((True, False) if quantized else (False,)):
                    epilogue = _size(_variant(family, wildcard(), bias, residual, act,
                                              quantized, tail, sizing=True)[1])
                    for rank, data in enumerate((*_PROLOGUES[family], wildcard)):
                        name, pattern = _variant(family, data(), bias, residual, act,
                                                 quantized, tail)
                        variants.append(((-epilogue, rank), name, pattern))
    variants.sort(key=lambda v: v[0])  # the longest epilogue first, with its prologue first
    limit = max_group_size + (QUANTIZATION_OPS if quantized else 0)
    return [FusionPattern(name, pattern, {}, _at_most(limit)) for _, name, pattern in variants]


#: The ops an int8 build's epilogue holds beyond the float32 one's, which its group may hold
#: over the rule's max_group_size: the sums' dequantization (2), the residual's (3) and the
#: output's quantization (4).
QUANTIZATION_OPS = 9


def dequantized(anchor: DFPattern) -> DFPattern:
    """The anchor, or its int32 sums scaled back to float32 (an int8 build's GEMM or conv:
    :mod:`tvmfuse.passes.quantize_int8`)."""
    return is_op("relax.multiply")(is_op("relax.astype")(anchor), is_const()) | anchor


def dequantized_input() -> DFPattern:
    """A tensor stored quantized, read as float32: ``float32(xq) * sx + c`` (QuantizeInt8)."""
    widened = is_op("relax.multiply")(is_op("relax.astype")(wildcard()), is_const())
    return is_op("relax.add")(widened, is_const())


def quantize(y: DFPattern) -> DFPattern:
    """``y`` quantized to uint8 as QuantizeInt8 writes it: ``uint8(clip(y * c + z, 0, 255))``."""
    shifted = is_op("relax.add")(is_op("relax.multiply")(y, is_const()), is_const())
    return is_op("relax.astype")(is_op("relax.clip")(shifted, wildcard(), wildcard()))


def _variant(family: str, data: DFPattern, bias: bool, residual: bool, act: str | None,
             quantized: bool = False, tail: bool = False, sizing: bool = False
             ) -> tuple[str, DFPattern]:
    """The pattern of one variant and its name; ``quantized`` an int8 build's, ``tail`` with its
    output quantized. ``sizing``: the pattern whose size orders the variants, the residual a
    plain operand (its dequantization is an alternative to a plain operand and does not make a
    variant longer than its bias one)."""
    y = is_op(ANCHORS[family])(data, wildcard())
    if quantized:
        y = dequantized(y)
    parts = []
    if bias:  # a folded bias is a constant; a residual is computed
        y, parts = is_op("relax.add")(y, is_const()), [*parts, "bias"]
    if residual:  # (dpl matches add and multiply in either operand order)
        operand = dequantized_input() | wildcard() if quantized and not sizing else wildcard()
        y, parts = is_op("relax.add")(y, operand), [*parts, "add"]
    if act:
        y, parts = ACTIVATIONS[act](y), [*parts, act]
    if tail:
        y, parts = quantize(y), [*parts, "quantize"]
    return f"tvmfuse.{family}.{'_'.join(parts)}", y


def isolate_patterns(family: str) -> list[FusionPattern]:
    """With ``family`` switched off, its anchors become kernels of their own: nothing fuses in."""
    anchor = is_op(ANCHORS[family])(wildcard(), wildcard())
    return [FusionPattern(f"tvmfuse.{family}.off", anchor)]


def _size(pattern: DFPattern, seen: set | None = None) -> int:
    """Ops in a pattern (its call nodes, shared sub-patterns counted once; an alternative counts
    as its larger side)."""
    seen = set() if seen is None else seen
    if pattern in seen:  # ObjectRefs hash by identity
        return 0
    seen.add(pattern)
    if isinstance(pattern, OrPattern):
        return max(_size(pattern.left, set(seen)), _size(pattern.right, set(seen)))
    if not hasattr(pattern, "args"):
        return 0
    return 1 + sum(_size(arg, seen) for arg in pattern.args)


def _at_most(limit: int):
    """Accept a match of at most ``limit`` ops whose intermediates nothing outside it uses: a
    value the group hides (a block output that is also a later residual) must stay a kernel
    output."""
    def check(context) -> bool:
        return (len(context.matched_bindings) <= limit
                and not has_leaking_intermediate_variables(context))

    return check
