"""Fused kernels read as the GEMM kernels' input (:class:`GemmMatch`): ``out = epilogue(A @ B)``
found in a PrimFunc as FuseTIR leaves it, and the TIR helpers that read it (blocks inlined,
expressions rebuilt over the kernel's buffers), which ``conv_match.py`` and ``row_norm.py`` use
for convs and normalized rows."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm.script import tirx as T

from tvmfuse.targets import SM90_GPU, GpuFacts

from .wgmma import ROW_VIEWS, gemm_kernel
from .wgmma_tile import ConvGeometry


@dataclass(frozen=True)
class GemmMatch:
    """A fused kernel the wgmma kernel computes: ``out = epilogue(A @ B)`` with A [..., M', K]
    (rows: the leading axes), B [K, N] (``b_kn``, a legalized linear layer's weight, which the
    kernel reads transposed) or [N, K], and an elementwise epilogue."""

    func: tvm.tirx.PrimFunc
    a: tvm.tirx.Buffer
    b: tvm.tirx.Buffer
    out: tvm.tirx.Buffer
    m: int
    n: int
    k: int
    b_kn: bool
    #: The output block's iterators (rows..., column), its stored value, and the matmul's
    #: buffer that value reads (the accumulator, in the kernel).
    iters: tuple
    value: object
    accumulator: tvm.tirx.Buffer
    #: Set where the kernel is an NHWC conv (A its input, B its OHWI weight) with a window
    #: or strides: the kernel computes it as an implicit GEMM.
    conv: ConvGeometry | None = None
    #: Set where the kernel normalizes its output rows (``row_norm.RowNormMatch``): the
    #: epilogue above then computes the row element, not the stored value.
    row_norm: object = None

    @property
    def b_index(self) -> int:
        """B's position among the kernel's parameters."""
        return [p.same_as(self.b) for p in self.func.params].index(True)

    def kernel(self, tile=None, build: Callable | None = None,
               gpu: GpuFacts = SM90_GPU) -> tvm.tirx.PrimFunc:
        """The TIRx kernel for ``gpu``, its parameters in the fused kernel's order (B now
        [N, K]); ``build`` writes it (by default :func:`wgmma.gemm_kernel` with ``tile``, a
        ``WgmmaTile``; ``mma_gemm.gemm_kernel`` with a ``MmaGemmTile`` takes the same
        arguments)."""
        extents = [int(d) for d in self.out.shape[:-1]]
        # the epilogue's other buffers declared anew, as TIRx declares buffers (those of the
        # s_tir kernel have no layout, which TIRx's FlattenBuffer cannot place)
        extra = tuple(p for p in self.func.params
                      if not any(p.same_as(x) for x in (self.a, self.b, self.out)))
        # A 0-d one (a clip's bound: MobileNetV2's ReLU6 in fp16) as one element: TIRx's
        # FlattenBuffer does not place 0-d parameters ("used before its definition"); the
        # calls pass it reshaped (``passes.use_wgmma_gemms``)
        fresh = [(old, tvm.tirx.decl_buffer([int(d) for d in old.shape] or [1], old.dtype,
                                            old.name)) for old in extra]
        # a buffer shaped as the output (a residual) read where the output is stored: read as
        # [rows, columns], its element at (row, col), not through row's position in each
        # leading axis (64-bit divisions by 196 and 14 in every element's address hold
        # ResNet-50's residual 1x1 convs far below their memory roofline)
        shape = [int(d) for d in self.out.shape]
        views = {new: None for old, new in fresh
                 if [int(d) for d in old.shape] == shape and len(shape) > 2}
        views = dict(list(views.items())[:ROW_VIEWS])

        def bind(iters, row, col) -> dict:
            """The values of a block's ``iters`` (rows..., column) at C[row, col]."""
            index = []
            for extent in reversed(extents):
                index.append(row % extent)
                row = row // extent
            return {var: T.Cast(var.ty, value)
                    for var, value in zip(iters, [*reversed(index), col])}

        def epilogue(acc, row, col):
            flat_row, bound = row, bind(self.iters, row, col)

            def on_load(load):
                if load.source.same_as(self.accumulator):
                    return acc
                new = next(new for old, new in fresh if old.same_as(load.source))
                if views.get(new) is not None and is_identity(load.indices, self.iters):
                    return views[new](flat_row, col)
                return None

            return rebuild(self.value, on_load, bound, fresh)

        norm = {} if self.row_norm is None else {
            "row_norm": self.row_norm.row_norm(bind, fresh)}
        func = (build or gemm_kernel)(self.m, self.n, self.k, tile, out_dtype=str(self.out.dtype),
                           in_dtype=str(self.a.dtype), epilogue=epilogue,
                           extra=tuple(new for _, new in fresh),
                           a_shape=tuple(int(d) for d in self.a.shape),
                           b_shape=None if self.b_kn else tuple(int(d) for d in self.b.shape),
                           c_shape=tuple(int(d) for d in self.out.shape), conv=self.conv,
                           row_views=views, gpu=gpu, **norm)
        a, b, *_, c = func.params
        params = [a if p.same_as(self.a) else b if p.same_as(self.b) else c
                  if p.same_as(self.out) else next(new for old, new in fresh if old.same_as(p))
                  for p in self.func.params]
        return tvm.tirx.PrimFunc(params, func.body, func.ret_type, func.attrs)


def match_gemm(func: tvm.tirx.PrimFunc, in_dtype: str = "float16") -> GemmMatch | None:
    """The GEMM ``func`` computes, if it is one the wgmma kernel takes: one matmul of
    ``in_dtype`` parameters summed in float32, rows contiguous, then elementwise blocks
    (bias, activation, residual, casts) into the last parameter; None otherwise."""
    fused = fused_blocks(func)
    if fused is None:
        return None
    sch, matmul = fused
    found = match_matmul(sch.get(matmul), func.params, in_dtype)
    if found is None:
        return None
    a, b, accumulator, spatial, b_kn = found
    m = math.prod(int(iv.dom.extent) for iv in spatial[:-1])
    n, k = int(spatial[-1].dom.extent), int(a.shape[-1])
    epilogue = match_epilogue(sch, matmul, func.params[-1], accumulator, spatial)
    if epilogue is None or k % 8:
        return None
    return GemmMatch(func, a, b, func.params[-1], m, n, k, b_kn, *epilogue, accumulator)


def fused_blocks(func: tvm.tirx.PrimFunc, keep_producers: bool = False):
    """``(schedule, the one reduction block)`` of ``func``, its other blocks but the last
    parameter's writer inlined (all but those feeding the reduction with ``keep_producers``);
    None where it has no or several reductions, or blocks that do not inline."""
    from tvm import s_tir  # noqa: PLC0415

    try:
        sch = s_tir.Schedule(func)
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    except Exception:  # noqa: BLE001 - a kernel written without blocks is not ours to take
        return None
    is_reduction = [reduces(sch.get(b)) for b in blocks]
    if sum(is_reduction) != 1 or not func.params:
        return None
    matmul = blocks[is_reduction.index(True)]
    keep = {r.source for r in sch.get(matmul).reads} if keep_producers else set()
    return (sch, matmul) if inline_blocks(sch, matmul, func.params[-1], keep) else None


def reduces(block) -> bool:
    """``block`` has a reduction axis."""
    return any(iv.iter_type != tvm.tirx.IterVar.DataPar for iv in block.iter_vars)


def inline_blocks(sch, matmul, out: tvm.tirx.Buffer, keep: set = frozenset()) -> bool:
    """Inline each block of ``sch`` but the reduction ``matmul``, the writer of ``out`` and
    those writing a buffer in ``keep``; False where one does not inline."""
    from tvm import s_tir  # noqa: PLC0415

    for block in list(sch.get_child_blocks(sch.get_sblock("root"))):
        writes = sch.get(block).writes
        if sch.get(block).same_as(sch.get(matmul)) or any(
                w.source.same_as(out) or w.source in keep for w in writes):
            continue
        try:
            sch.compute_inline(block)
        except s_tir.ScheduleError:
            return False
    return True


def match_epilogue(sch, matmul, out: tvm.tirx.Buffer, accumulator: tvm.tirx.Buffer, spatial):
    """``(iterators, value)`` of what the kernel stores in ``out`` at each output of the
    reduction ``matmul`` (the accumulator cast, or the one elementwise block left after it,
    reading the accumulator where it stores and parameters elsewhere); None otherwise."""
    rest = [block for block in sch.get_child_blocks(sch.get_sblock("root"))
            if not sch.get(block).same_as(sch.get(matmul))]
    if accumulator.same_as(out):
        if rest:
            return None
        iters = tuple(iv.var for iv in spatial)
        value = T.Cast(str(out.dtype), tvm.tirx.BufferLoad(accumulator, list(iters)))
    else:
        if len(rest) != 1:
            return None
        stmt = sch.get(rest[0])
        store = stmt.body
        iters = tuple(iv.var for iv in stmt.iter_vars)
        if (not isinstance(store, tvm.tirx.BufferStore) or not store.buffer.same_as(out)
                or not is_identity(store.indices, iters)
                or [int(iv.dom.extent) for iv in stmt.iter_vars]
                != [int(iv.dom.extent) for iv in spatial]):
            return None
        value = store.value
        loads = []
        try:
            rebuild(value, loads.append, {})  # walks the value: append keeps each load
        except ValueError:
            return None
        # the accumulator read where it is stored, the rest parameters (a bias, a residual)
        params = sch.mod["main"].params
        if not loads or not all(
                is_identity(load.indices, iters) if load.source.same_as(accumulator)
                else any(load.source.same_as(p) for p in params) for load in loads):
            return None
    if str(out.dtype) not in ("float16", "bfloat16", "float32"):
        return None
    return iters, value


def match_matmul(block, params, in_dtype: str):
    """``(A, B, C, spatial iterators, B is [K, N])`` of ``C[s..., j] += f32(A[s..., k]) *
    f32(B[k, j] or B[j, k])`` with A and B parameters, else None. Reductions of extent 1 beside
    k are read as 0: a 1x1 stride-1 NHWC conv, ``C[n, h, w, o] += X[n, h + ry, w + rx, c] *
    W[o, ry, rx, c]``, is such a GEMM (W [N, 1, 1, K])."""
    store = block.body
    spatial = [iv for iv in block.iter_vars if iv.iter_type == tvm.tirx.IterVar.DataPar]
    reduce = [iv for iv in block.iter_vars if iv.iter_type != tvm.tirx.IterVar.DataPar]
    summed = [iv for iv in reduce if int(iv.dom.extent) != 1]
    if not isinstance(store, tvm.tirx.BufferStore) or len(summed) != 1 or len(spatial) < 2:
        return None
    acc, kvar = store.buffer, summed[0].var
    unit = {iv.var: tvm.tirx.const(0, iv.var.ty) for iv in reduce if int(iv.dom.extent) == 1}
    svars = [iv.var for iv in spatial]
    value = store.value
    if (str(acc.dtype) != "float32" or not is_identity(store.indices, svars)
            or not isinstance(value, tvm.ir.prim.expr.Add)
            or not isinstance(value.b, tvm.ir.prim.expr.Mul)):
        return None
    loads = []
    for operand in (value.b.a, value.b.b):
        if not isinstance(operand, tvm.ir.prim.expr.Cast) or not isinstance(
                operand.value, tvm.ir.TensorLoad):
            return None
        loads.append(operand.value)
    a, b = (load.source for load in loads)
    if (not all(any(x.same_as(p) for p in params) for x in (a, b))
            or {str(a.dtype), str(b.dtype)} != {in_dtype}
            or [int(d) for d in a.shape[:-1]] != [int(iv.dom.extent) for iv in spatial[:-1]]):
        return None
    a_index, b_index = (_without_units(load.indices, unit) for load in loads)
    if not is_identity(a_index, [*svars[:-1], kvar]):
        return None
    if len(b.shape) == 2 and is_identity(b_index, [kvar, svars[-1]]):
        return a, b, acc, spatial, True
    if (is_identity([b_index[0], b_index[-1]], [svars[-1], kvar])
            and all(int(d) == 1 for d in b.shape[1:-1])
            and all(isinstance(i, tvm.tirx.IntImm) and int(i) == 0 for i in b_index[1:-1])):
        return a, b, acc, spatial, False
    return None


def _without_units(indices, unit: dict) -> list:
    """``indices`` with the unit reductions set to 0, simplified (``h + ry`` -> ``h``)."""
    analyzer = tvm.sym.Analyzer()
    return [analyzer.simplify(rebuild(i, lambda load: None, unit)) for i in indices]


def is_identity(indices, variables) -> bool:
    return len(indices) == len(variables) and all(
        isinstance(i, tvm.tirx.Var) and i.same_as(v) for i, v in zip(indices, variables))


_BINARY = tuple(getattr(tvm.ir.prim.expr, name) for name in (
    "Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min", "Max",
    "EQ", "NE", "LT", "LE", "GT", "GE", "And", "Or"))


def rebuild(expr, on_load, bound: dict, buffers=()):
    """``expr`` with variables replaced by ``bound`` and each load by ``on_load(load)`` (None:
    the load kept, its indices rebuilt, its buffer replaced where ``buffers`` pairs it (old,
    new)). The epilogues of fused kernels are casts, arithmetic, selects and math calls;
    anything else raises ``ValueError``."""
    def visit(e):
        if isinstance(e, tvm.ir.TensorLoad):
            replaced = on_load(e)
            if replaced is None:
                source = next((new for old, new in buffers if old.same_as(e.source)), e.source)
                indices = [visit(i) for i in e.indices]
                if not indices and len(source.shape) == 1:  # a 0-d buffer declared as one
                    indices = [0]
                return tvm.tirx.BufferLoad(source, indices)
            return replaced
        if isinstance(e, tvm.tirx.Var):
            return next((v for var, v in bound.items() if var.same_as(e)), e)
        if isinstance(e, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
            return e
        if isinstance(e, tvm.ir.prim.expr.Cast):
            return T.Cast(e.ty, visit(e.value))
        if isinstance(e, _BINARY):
            return type(e)(visit(e.a), visit(e.b))
        if isinstance(e, tvm.ir.prim.expr.Not):
            return type(e)(visit(e.a))
        if isinstance(e, tvm.ir.prim.expr.Select):
            return type(e)(visit(e.condition), visit(e.true_value), visit(e.false_value))
        if isinstance(e, tvm.ir.Call):
            return tvm.ir.Call(e.op, [visit(arg) for arg in e.args], ret_ty=e.ty)
        raise ValueError(f"an epilogue with {type(e).__name__} is not taken")
    return visit(expr)
