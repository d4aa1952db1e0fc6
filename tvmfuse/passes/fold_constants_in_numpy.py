"""FoldConstantsInNumPy: the weight arithmetic and layout changes over constants (transposes,
reshapes, scales, pads, casts) evaluated with NumPy at build time, before TVM's FoldConstant.

TVM's FoldConstant evaluates a constant call by legalizing it, compiling the PrimFunc with LLVM
and running it: one compile per distinct op and shape, which made up most of a CNN build's
passes (``docs/build-time.md``). The ops here are computed as NumPy computes them (elementwise
float32 arithmetic is IEEE in both, with no warnings: a kernel raises none); any other call over
constants is left to FoldConstant, which runs after.

Preconditions: none (a call is folded only when all its arguments are constants).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ._rewrite import mutate_functions, static_shape

#: The dtypes NumPy computes as TVM does (bfloat16 has no NumPy type; float16 math would differ).
_DTYPES = ("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")

_BINARY = {"relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
           "relax.divide": np.divide, "relax.maximum": np.maximum, "relax.minimum": np.minimum,
           "relax.equal": np.equal, "relax.not_equal": np.not_equal, "relax.less": np.less,
           "relax.less_equal": np.less_equal, "relax.greater": np.greater,
           "relax.greater_equal": np.greater_equal, "relax.bitwise_and": np.bitwise_and,
           "relax.bitwise_or": np.bitwise_or, "relax.logical_and": np.logical_and,
           "relax.logical_or": np.logical_or}
#: The binary ops that take booleans as NumPy does.
_LOGICAL = ("relax.equal", "relax.not_equal", "relax.bitwise_and", "relax.bitwise_or",
            "relax.logical_and", "relax.logical_or")
_UNARY = {"relax.sqrt": np.sqrt, "relax.negative": np.negative, "relax.abs": np.abs,
          "relax.rsqrt": lambda x: 1 / np.sqrt(x)}
#: Ops whose result is their input's values in another shape (the output's static shape).
_RESHAPES = ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten")
#: Every op this pass folds.
FOLDED = frozenset({*_BINARY, *_UNARY, *_RESHAPES, "relax.permute_dims", "relax.astype",
                    "relax.concat", "relax.nn.pad", "relax.broadcast_to", "relax.strided_slice",
                    "relax.take", "relax.gather_elements"})


def _evaluate(call: relax.Call, args: list):
    """``call``'s value from its arguments' values (NumPy arrays, or tuples of them), or None
    where this op or its dtype is left to TVM."""
    name, attrs, out = call.op.name, call.attrs, call.ty
    shape = static_shape(out.shape)  # None for a symbolic one (--dynamic): left to run time
    if shape is None or str(out.dtype) not in _DTYPES:
        return None
    if name in _BINARY and (name != "relax.divide" or str(out.dtype).startswith("float")):
        # operands of two dtypes promote differently in NumPy; booleans do arithmetic there
        # that TVM does not (bool - bool raises, bool + bool is an or)
        if args[0].dtype != args[1].dtype or (args[0].dtype == bool and name not in _LOGICAL):
            return None
        return _BINARY[name](*args)
    if name in _UNARY and args[0].dtype.kind == "f":
        return _UNARY[name](args[0])
    if name in _RESHAPES:
        return args[0].reshape(shape)
    if name == "relax.permute_dims":
        return np.transpose(args[0], None if attrs.axes is None else [int(a) for a in attrs.axes])
    if name == "relax.astype":
        return args[0].astype(str(attrs.dtype))
    if name == "relax.concat" and attrs.axis is not None:
        return np.concatenate(args[0], axis=int(attrs.axis))
    if name == "relax.nn.pad" and str(attrs.pad_mode) == "constant":
        widths = [int(w) for w in attrs.pad_width]
        return np.pad(args[0], list(zip(widths[::2], widths[1::2])),
                      constant_values=float(attrs.pad_value))
    if name == "relax.broadcast_to":
        return np.broadcast_to(args[0], shape)
    if name == "relax.strided_slice":
        return _strided_slice(*args)
    if name in ("relax.take", "relax.gather_elements") and attrs.axis is not None:
        data, indices = args
        axis = int(attrs.axis)
        if indices.size and not 0 <= indices.min() <= indices.max() < data.shape[axis]:
            return None  # out of range: what TVM does with them depends on the mode
        if name == "relax.take":
            return np.take(data, indices, axis=axis)
        if indices.ndim != data.ndim or any(
                i != d for k, (i, d) in enumerate(zip(indices.shape, data.shape))
                if k != axis % data.ndim):
            return None  # indices narrower than the data off the gathered axis
        return np.take_along_axis(data, indices, axis=axis)
    return None


def _strided_slice(data: np.ndarray, axes: list, begin: list, end: list, strides=None):
    """``strided_slice`` as a NumPy slice, where every step is positive (TVM clamps the bounds
    as Python's slices do); else None."""
    strides = strides or [1] * len(axes)
    if any(step <= 0 for step in strides):
        return None
    index = [slice(None)] * data.ndim
    for axis, start, stop, step in zip(axes, begin, end, strides):
        index[axis] = slice(start, stop, step)
    return data[tuple(index)]


@tvm.transform.module_pass(opt_level=0, name="FoldConstantsInNumPy")
class FoldConstantsInNumPy:
    """Fold the constant calls NumPy evaluates; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return mutate_functions(mod, _Fold(mod))


@tvm.transform.module_pass(opt_level=0, name="FoldRemainingConstants")
class FoldRemainingConstants:
    """TVM's FoldConstant where some call reads only constants (or a variable is bound to one);
    elsewhere the module as it is. The pass legalizes every call of the module to find what it
    can fold: 0.8 s of ResNet-50's build on a Zen 4 where :class:`FoldConstantsInNumPy` had
    left it nothing (``python benchmarks/build_time.py``)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if any(_has_constant_binding(func) for func in mod.functions.values()
               if isinstance(func, relax.Function)):
            return relax.transform.FoldConstant()(mod)
        return relax.transform.DeadCodeElimination()(mod)  # FoldConstant drops unused bindings


def _has_constant_binding(func: relax.Function) -> bool:
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call):
                if all(_is_known(arg) for arg in value.args):
                    return True
            elif _is_known(value) and not isinstance(value, relax.Tuple):
                return True  # FoldConstant puts a constant or a shape where it is read
    return False


def _is_known(expr: relax.Expr) -> bool:
    """Known at build time: no variable, call or item of a tuple in it."""
    if isinstance(expr, relax.Tuple):
        return all(_is_known(field) for field in expr.fields)
    return not isinstance(expr, (relax.Var, relax.Call, relax.TupleGetItem, relax.If,
                                 relax.SeqExpr, relax.Function))


@relax.expr_functor.mutator
class _Fold(relax.PyExprMutator):
    """Bindings whose value folds are dropped and their uses read the constant."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.folded: dict[relax.Var, tvm.ir.expr.Constant] = {}

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        return self.folded.get(var) or super().visit_var_(var)

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> relax.Expr:
        return self.folded.get(var) or super().visit_dataflow_var_(var)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = self.visit_expr(binding.value)
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) \
                and value.op.name in FOLDED and isinstance(value.ty, relax.TensorType) \
                and all(_is_static(a) for a in value.args):
            with np.errstate(all="ignore"):
                folded = _evaluate(value, [_value(a) for a in value.args])
            if folded is not None and list(np.shape(folded)) == static_shape(value.ty.shape):
                dtype = str(value.ty.dtype)
                array = np.ascontiguousarray(np.asarray(folded).astype(dtype, copy=False))
                self.folded[binding.var] = relax.const(array, dtype)
                return
        super().visit_var_binding_(binding)


def _is_static(expr: relax.Expr) -> bool:
    """A constant, a static shape, or a tuple of constants or of integers."""
    if isinstance(expr, relax.Tuple):
        return all(isinstance(f, (tvm.ir.expr.Constant, tvm.tirx.IntImm)) for f in expr.fields)
    return isinstance(expr, (tvm.ir.expr.Constant, relax.ShapeExpr))


def _value(expr: relax.Expr):
    """A visited argument's value: a constant's array, a tuple of them, a static shape, else
    None."""
    if isinstance(expr, tvm.ir.expr.Constant):  # a scalar's value may be a Python number
        value = expr.value
        return value.numpy() if hasattr(value, "numpy") else np.asarray(value, str(expr.ty.dtype))
    if isinstance(expr, relax.ShapeExpr):  # reshape's target shape: the output's, read there
        return expr
    if isinstance(expr, tvm.tirx.IntImm):  # strided_slice's bounds
        return int(expr.value)
    if isinstance(expr, relax.Tuple):
        fields = [_value(f) for f in expr.fields]
        return None if any(f is None for f in fields) else fields
    return None
