"""QuantizeInt8 and ObserveQuantized: post-training static int8 quantization of the GEMMs and
convs whose weights are constants.

An int8 build's GEMMs and convs read uint8 activations and int8 weights and sum their products
in int32 (AVX-512 VNNI's ``vpdpbusd``: ``schedules/cpu/int8_dot.py``). Each site (a dense conv
in NHWC/HWIO or a matmul by a constant ``[K, N]`` matrix, its reduction in whole quads) becomes

    xq  = uint8(clip(x / sx + zp + 0.5, 0, 255))      asymmetric, per tensor (x's range)
    acc = conv2d(xq, Wq) | matmul(xq, Wq), int32      Wq = round(W / sw), symmetric per column
    y   = float32(acc) * (sx * sw) + offset           offset = -zp * sx * sw * sum_k Wq[k, n]

so that ``y`` is ``x @ W`` up to rounding: the zero point's share of every sum is a constant per
output column, folded into the bias where one follows (a constant add). Weights are quantized
per output column over [-127, 127]; the input's scale ``sx`` and zero point ``zp`` map the range
its calibration saw (with 0 in it, so that 0.0 is exact) onto [0, 255]. A conv's own padding
reads 0, which is ``x = 0.0`` only where ``zp`` is 0 (a ReLU's output); over an input that goes
below 0 (an image-reading stem) the quantized input is padded with ``zp`` by a pad of its own,
and the conv pads nothing. That pad also gives a conv over input channels that are not whole
quads (an RGB stem's 3) the channels it lacks, against zero weights. A matmul whose reduction
is not whole quads stays float32.

A conv's quantized input that other ops read too (a residual block's input, which the block's
last add reads) is stored only quantized: those readers dequantize the uint8 copy,
``(float32(xq) - zp) * sx``, which the epilogue patterns take into their kernels, as ONNX
Runtime's int8 ResNets keep their residual stream in uint8. The block's output is then written
as uint8 by its kernel, not as float32 and then quantized by another (ResNet-50: a quarter of
the bytes its residual kernels moved). A max pool over a tensor that only the pool reads, whose
output is quantized, pools the quantized input instead (quantization is monotonic, so the two
orders agree exactly): the stem's kernel writes uint8 and the pool reads a quarter of the bytes.

A site whose input a uint8 grid resolves poorly stays float32: where the rounding noise of one
step (``sx**2 / 12``) is within MIN_SNR_DB of the input's variance (a range stretched by rare
outliers), and the build's log names it.

The range of each site's input comes from a calibration run: ObserveQuantized adds the minimum,
maximum, mean and mean square of every distinct site input to ``main``'s outputs (after the
model's own, in the order the sites bind), and the build runs that float32 module on calibration
inputs (:mod:`tvmfuse.calibrate`); QuantizeInt8 takes the ranges in the same order. Both
enumerate the sites of the same module (the pipeline up to here is the same for both), so the
orders agree; a count that does not is an error, never a silent misassignment.

Preconditions: after the layout passes (NHWC/HWIO convs; Winograd off, which would turn 3x3
convs into batched matmuls first) and the folds; weights are constants.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

import numpy as np
import tvm
from tvm import relax

from ..errors import TvmfuseError
from ._rewrite import calls_op, dtype_of, var_uses, with_fields

log = logging.getLogger(__name__)

#: The products one instruction sums per lane (``vpdpbusd``: four): a site's reduction must
#: be a multiple, for its kernel to run on the instruction.
GROUP = 4
#: The largest magnitude of an int8 weight: symmetric, so -128 is not used.
WEIGHT_MAX = 127
#: The uint8 activation's largest value.
ACTIVATION_MAX = 255
#: What ObserveQuantized returns of each input, in order.
STATISTICS = ("min", "max", "mean", "meansq")
#: The least signal-to-noise ratio (dB: the input's variance over a uint8 step's rounding noise,
#: ``sx**2 / 12``) at which a site is quantized. A tensor spread over its range sits near 40 dB
#: (the inputs of ResNet's, ViT's, ConvNeXt's, T5's sites: 39-45 dB); one whose range a few
#: outliers stretch falls below (EfficientNet's squeeze-excited expansions: 29 dB). A build logs
#: each site under it (`tvmfuse build MODEL --dtype int8`).
MIN_SNR_DB = 33.0

_CONV, _MATMUL = "relax.nn.conv2d", "relax.matmul"


def _sites(func: relax.Function) -> list[relax.Call]:
    """The calls bound in ``func`` that may be quantized, in binding order."""
    return [binding.value for block in func.body.blocks for binding in block.bindings
            if _quantizable(binding.value)]


def _quantizable(call) -> bool:
    if not (calls_op(call, _CONV) or calls_op(call, _MATMUL)):
        return False
    data, weight = call.args[0], call.args[1]
    if not (isinstance(weight, tvm.ir.expr.Constant) and str(weight.value.dtype) == "float32"):
        return False
    if dtype_of(data) != "float32":
        return False
    shape = weight.value.shape
    if call.op.name == _CONV:
        attrs = call.attrs
        return (int(attrs.groups) == 1 and str(attrs.data_layout) == "NHWC"
                and str(attrs.kernel_layout) == "HWIO" and str(attrs.out_layout) == "NHWC")
    return len(shape) == 2 and shape[0] % GROUP == 0


def _inputs(sites: list[relax.Call]) -> list[relax.Var]:
    """The distinct inputs of ``sites``, in the order they are first read."""
    seen: list[relax.Var] = []
    for call in sites:
        data = call.args[0]
        if not any(data.same_as(v) for v in seen):
            seen.append(data)
    return seen


@tvm.transform.module_pass(opt_level=0, name="ObserveQuantized")
class ObserveQuantized:
    """Return, after ``main``'s own outputs, the STATISTICS of each input of its quantizable sites
    (see the module docstring): ``(outputs, (min_0, max_0, mean_0, meansq_0, min_1, ...))``."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        func = mod["main"]
        _check_one_block(func)
        statistics = {"min": relax.op.min, "max": relax.op.max, "mean": relax.op.mean,
                      "meansq": lambda x: relax.op.mean(relax.op.multiply(x, x))}
        bindings, observed = [], []
        for index, data in enumerate(_inputs(_sites(func))):
            for name in STATISTICS:
                var = relax.Var(f"observed_{name}_{index}")
                bindings.append(relax.VarBinding(var, statistics[name](data)))
                observed.append(var)
        (block,) = func.body.blocks
        blocks = [relax.DataflowBlock([*block.bindings, *bindings])]
        body = relax.SeqExpr(blocks, relax.Tuple([func.body.body, relax.Tuple(observed)]))
        scalar = relax.TensorType((), "float32")
        ty = relax.TupleType([func.ret_ty, relax.TupleType([scalar] * len(observed))])
        updated = mod.clone()
        updated["main"] = relax.Function(func.params, body, ty, attrs=func.attrs)
        return relax.transform.Normalize()(updated)


def _check_one_block(func: relax.Function) -> None:
    """The passes add bindings beside the sites' own: ``main`` must be one dataflow block (as
    imported models are), or the new bindings could fall out of their inputs' scope."""
    blocks = func.body.blocks
    if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
        raise TvmfuseError(f"--dtype int8 quantizes a main function of one dataflow block; this "
                           f"model's has {len(blocks)} blocks: build it in fp32 or bf16")


@tvm.transform.module_pass(opt_level=0, name="QuantizeInt8")
class QuantizeInt8:
    """Quantize ``main``'s sites; ``ranges`` holds ``(min, max, standard deviation)`` of each
    distinct site input, in ObserveQuantized's order (see :mod:`tvmfuse.calibrate`)."""

    def __init__(self, ranges: Sequence[tuple[float, float, float]]):
        self.ranges = [tuple(map(float, r)) for r in ranges]

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        func = mod["main"]
        _check_one_block(func)
        sites = _sites(func)
        inputs = _inputs(sites)
        if len(inputs) != len(self.ranges):
            raise TvmfuseError(f"the calibration observed {len(self.ranges)} quantized inputs "
                               f"where the module has {len(inputs)}: calibrate again with "
                               f"this tvmfuse")
        ranges = {}
        for data, (low, high, std) in zip(inputs, self.ranges):
            snr = signal_to_noise(low, high, std)
            if snr >= MIN_SNR_DB:
                ranges[data] = (low, high)
            else:
                log.warning("int8: %s (%s, range %.3g to %.3g) stays float32: %.0f dB of signal "
                            "over a uint8 step's noise, under %.0f", data.name,
                            _readers(sites, data), low, high, snr, MIN_SNR_DB)
        if not ranges:
            log.warning("int8: no GEMM or conv over constant weights to quantize (%d left "
                        "float32): the build computes in float32", len(inputs))
        reads = var_uses(func)
        by_sites = Counter(call.args[0] for call in sites)
        stored = _stored_quantized(sites, reads, by_sites) & set(ranges)
        mutator = _Quantize(mod, ranges, _biased(func, reads), stored,
                            _pooled(func, reads, by_sites, stored) & set(ranges))
        updated = mod.clone()
        updated["main"] = mutator.visit_expr(func)
        return updated


def signal_to_noise(low: float, high: float, std: float) -> float:
    """The ratio (dB) of a tensor's variance to the rounding noise of its uint8 step."""
    scale, _ = activation_scale(low, high)
    return float(10 * np.log10(max(std, 1e-30) ** 2 / (scale * scale / 12)))


def _readers(sites: list[relax.Call], data: relax.Var) -> str:
    """The ops of the sites that read ``data``, in words (for the log)."""
    ops = sorted({call.op.name.removeprefix("relax.").removeprefix("nn.")
                  for call in sites if call.args[0].same_as(data)})
    return " and ".join(ops) + " input"


def _stored_quantized(sites: list[relax.Call], reads: Counter, by_sites: Counter) -> set:
    """The site inputs stored only quantized: conv inputs (NHWC feature maps) bound in the
    dataflow and read by other ops than sites too (see the module docstring)."""
    convs = {call.args[0] for call in sites if call.op.name == _CONV}
    return {var for var in convs if isinstance(var, relax.DataflowVar)
            and reads[var] > by_sites[var]}


def _pooled(func: relax.Function, reads: Counter, by_sites: Counter, stored: set) -> set:
    """The site inputs that are a max pool's output, read by sites only or ``stored``, over an
    input read by the pool only (see the module docstring)."""
    return {binding.var for block in func.body.blocks for binding in block.bindings
            if binding.var in by_sites
            and (reads[binding.var] == by_sites[binding.var] or binding.var in stored)
            and calls_op(binding.value, "relax.nn.max_pool2d")
            and reads[binding.value.args[0]] == 1}


def _bias_add(value) -> bool:
    """``value`` adds a constant to a variable (a bias, after a GEMM or conv)."""
    return (calls_op(value, "relax.add") and isinstance(value.args[0], relax.Var)
            and isinstance(value.args[1], tvm.ir.expr.Constant))


def _biased(func: relax.Function, reads: Counter) -> set:
    """The vars of ``func`` read once, by an add of a constant (a bias)."""
    return {binding.value.args[0] for block in func.body.blocks for binding in block.bindings
            if _bias_add(binding.value) and reads[binding.value.args[0]] == 1}


def activation_scale(low: float, high: float) -> tuple[float, int]:
    """The uint8 scale and zero point of a tensor seen within ``[low, high]``: the range,
    widened to hold 0, over [0, 255]."""
    low, high = min(low, 0.0), max(high, 0.0)
    if not np.isfinite(low) or not np.isfinite(high):
        raise TvmfuseError("the calibration saw a non-finite activation (inf or NaN); "
                           "calibrate on inputs the float32 model computes finite values for")
    scale = (high - low) / ACTIVATION_MAX or 1.0
    return scale, int(np.clip(round(-low / scale), 0, ACTIVATION_MAX))


def weight_scales(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(int8 weight, float32 scale per output column)`` of ``weight [..., N]``, symmetric."""
    flat = weight.reshape(-1, weight.shape[-1]).astype("float64")
    scale = np.abs(flat).max(axis=0) / WEIGHT_MAX
    scale[scale == 0] = 1.0
    quantized = np.clip(np.round(weight / scale), -WEIGHT_MAX, WEIGHT_MAX).astype("int8")
    return quantized, scale


@relax.expr_functor.mutator
class _Quantize(relax.PyExprMutator):
    def __init__(self, mod, ranges: dict, biased: set, stored: set, pooled: set):
        super().__init__(mod)
        self.ranges, self.biased, self.stored, self.pooled = ranges, biased, stored, pooled
        self.quantized: dict = {}  # input var -> its uint8 var
        self.pending: dict = {}  # site var -> (its dequantized var, offset): its bias to come

    def visit_var_binding_(self, binding):
        self._bind(binding)
        if binding.var in self.stored:
            self._dequantize(binding.var)

    def _bind(self, binding) -> None:
        """Emit ``binding``: a site quantized, a bias folded with its site's offset, a pool over
        the quantized input, or as it was."""
        value = binding.value
        if _quantizable(value) and value.args[0] in self.ranges:
            self.set_var_remap(binding.var, self._site(binding.var, value))
            return
        if _bias_add(value) and value.args[0] in self.pending:
            scaled, offset = self.pending.pop(value.args[0])
            bias = value.args[1].value.numpy().astype("float64") + offset
            var = self.builder_.emit(relax.op.add(scaled, relax.const(bias.astype("float32"))))
            self.set_var_remap(binding.var, var)
            return
        if binding.var in self.pooled:  # the pool over the quantized input, for the sites
            scale, zero = activation_scale(*self.ranges[binding.var])
            pooled = _quantized(self.visit_expr(value.args[0]), scale, zero)
            self.quantized[binding.var] = self.builder_.emit(
                relax.Call(value.op, [self.builder_.emit(pooled)], value.attrs))
            return
        super().visit_var_binding_(binding)

    def _dequantize(self, var: relax.Var) -> None:
        """Quantize ``var`` here, and make every later reader but the sites read it
        dequantized."""
        scale, zero = activation_scale(*self.ranges[var])
        xq = self._input(var, scale, zero)
        widened = relax.op.multiply(relax.op.astype(xq, "float32"), relax.const(scale, "float32"))
        self.set_var_remap(var, self.builder_.emit(
            relax.op.add(widened, relax.const(-zero * scale, "float32"))))

    def _site(self, var: relax.Var, call: relax.Call) -> relax.Var:
        data = call.args[0]
        low, high = self.ranges[data]
        scale, zero = activation_scale(low, high)
        xq = self._input(data, scale, zero)
        weight, column_scale = weight_scales(call.args[1].value.numpy())
        fields = {"out_dtype": "int32"}
        if call.op.name == _CONV:
            padding = [int(p) for p in call.attrs.padding]  # top, left, bottom, right
            channels = -weight.shape[2] % GROUP
            if (zero and any(padding)) or channels:
                # padded here with the zero point (x = 0.0), and to whole quads of channels
                xq = self.builder_.emit(relax.op.nn.pad(
                    xq, [0, 0, padding[0], padding[2], padding[1], padding[3], 0, channels],
                    pad_value=float(zero)))
                weight = np.pad(weight, [(0, 0), (0, 0), (0, channels), (0, 0)])
                fields["padding"] = [0, 0, 0, 0]
        acc = self.builder_.emit(relax.Call(call.op, [xq, relax.const(weight)],
                                            with_fields(call.attrs, fields), call.ty_args))
        multiplier = scale * column_scale
        scaled = self.builder_.emit(relax.op.multiply(
            relax.op.astype(acc, "float32"), relax.const(multiplier.astype("float32"))))
        if not zero:
            return scaled
        sums = weight.reshape(-1, weight.shape[-1]).astype("int64").sum(axis=0)
        offset = -zero * multiplier * sums
        if var in self.biased:  # the offset joins the bias
            self.pending[var] = (scaled, offset)
            return scaled
        return self.builder_.emit(relax.op.add(scaled, relax.const(offset.astype("float32"))))

    def _input(self, data: relax.Var, scale: float, zero: int) -> relax.Var:
        if data not in self.quantized:
            self.quantized[data] = self.builder_.emit(
                _quantized(self.visit_expr(data), scale, zero))
        return self.quantized[data]


def _quantized(x: relax.Expr, scale: float, zero: int) -> relax.Expr:
    """``uint8(clip(x / scale + zero + 0.5, 0, 255))``: ``x`` rounded to its nearest step."""
    shifted = relax.op.add(relax.op.multiply(x, relax.const(1.0 / scale, "float32")),
                           relax.const(zero + 0.5, "float32"))
    clipped = relax.op.clip(shifted, relax.prim_value(0.0),
                            relax.prim_value(float(ACTIVATION_MAX)))
    return relax.op.astype(clipped, "uint8")
