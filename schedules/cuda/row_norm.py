"""A GEMM whose rows are normalized in its epilogue (``layer_norm(x @ W + b + residual)``, the
``layer_norm_epilogue`` rule) read as the wgmma kernel's :class:`~wgmma.RowNorm`.

The fused kernel, as FuseTIR leaves it: the matmul, elementwise blocks up to the row element
``X`` (bias, residual, casts), one or two row sums over ``X`` (LayerNorm's sum, then its sum of
squared deviations from the mean; RMSNorm's sum of squares), per-row blocks between them (the
mean), and the elementwise block storing the normalized rows (gamma, beta, a cast). Every
block but the matmul, ``X``'s writer, the sums and the store is inlined; what is left is read as
expressions the kernel evaluates: ``X``'s value at each accumulator, each sum's term at each
element, the stored value at each element, reading the sums' totals where the blocks read the
sum buffers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm

from .gemm_match import GemmMatch, inline_blocks, is_identity, match_matmul, rebuild, reduces
from .wgmma import RowNorm


@dataclass(frozen=True)
class RowNormMatch:
    """The normalization after a :class:`~gemm_match.GemmMatch`'s GEMM: the row element buffer
    ``x`` (the match's epilogue computes it), the row sums (buffer, the block's iterators,
    its term), and the stored value with its iterators."""

    x: tvm.tirx.Buffer
    sums: tuple[tuple[tvm.tirx.Buffer, tuple, object], ...]
    out_iters: tuple
    out_value: object

    def row_norm(self, bind, fresh):
        """The kernel's :class:`~wgmma.RowNorm`: ``bind(iters, row, col)`` gives the iterators'
        values at an element, ``fresh`` pairs the fused kernel's buffers with the kernel's."""
        def reader(x, sums):
            def on_load(load):
                if load.source.same_as(self.x):
                    return x
                for index, (buffer, _, _) in enumerate(self.sums):
                    if load.source.same_as(buffer):
                        return sums[index]
                return None
            return on_load

        def term(index):
            _, iters, value = self.sums[index]
            return lambda x, row, col, sums: rebuild(value, reader(x, sums),
                                                      bind(iters, row, col), fresh)

        def output(x, row, col, sums):
            return rebuild(self.out_value, reader(x, sums), bind(self.out_iters, row, col), fresh)

        return RowNorm(str(self.x.dtype), tuple(term(i) for i in range(len(self.sums))), output)


def match_gemm_row_norm(func: tvm.tirx.PrimFunc, in_dtype: str = "float16") -> GemmMatch | None:
    """The GEMM + row normalization ``func`` computes (see the module docstring), as a
    :class:`~gemm_match.GemmMatch` whose epilogue computes the row element and whose ``row_norm``
    is the rest; None where ``func`` is not one."""
    from tvm import s_tir  # noqa: PLC0415

    try:
        sch = s_tir.Schedule(func)
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    except Exception:  # noqa: BLE001 - a kernel written without blocks is not ours to take
        return None
    reductions = [b for b in blocks if reduces(sch.get(b))]
    if len(reductions) not in (2, 3) or not func.params:
        return None
    matmul, first_sum = reductions[0], sch.get(reductions[1])
    found = match_matmul(sch.get(matmul), func.params, in_dtype)
    if found is None:
        return None
    a, b, accumulator, spatial, b_kn = found
    x = next((r.source for r in first_sum.reads if not r.source.same_as(first_sum.writes[0].source)
              and len(r.source.shape) == len(spatial)), None)
    out = func.params[-1]
    if x is None or x.same_as(accumulator) or not inline_blocks(
            sch, matmul, out, keep={x} | {sch.get(r).writes[0].source for r in reductions[1:]}):
        return None
    blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    if len(blocks) != len(reductions) + 2:
        return None
    writer, store = sch.get(blocks[1]), sch.get(blocks[-1])
    extents = [int(iv.dom.extent) for iv in spatial]
    x_value = _element(writer, x, extents)
    out_value = _element(store, out, extents)
    sums = tuple(_row_sum(sch.get(blk), x, extents) for blk in reductions[1:])
    if (x_value is None or out_value is None or None in sums
            or str(out.dtype) not in ("float16", "bfloat16", "float32")):
        return None
    # the element reads the accumulator where it stores and parameters elsewhere; the sums and
    # the stored value read X, earlier sums (at the row) and parameters
    # (A or B read again, a residual that is the GEMM's own input, is not taken: the kernel
    # reads its operands through TMA only)
    params = [p for p in sch.mod["main"].params if not (p.same_as(a) or p.same_as(b))]
    if not _reads_only(x_value[1], lambda load: is_identity(load.indices, x_value[0])
                       if load.source.same_as(accumulator) else _is_param(load, params)):
        return None
    sum_buffers = [buffer for buffer, _, _ in sums]
    for index, (_, iters, term) in enumerate(sums):
        if not _reads_only(term, lambda load, iters=iters, index=index: _reads_row(
                load, x, sum_buffers[:index], iters, params)):
            return None
    if not _reads_only(out_value[1], lambda load: _reads_row(load, x, sum_buffers, out_value[0],
                                                             params)):
        return None
    m, n, k = math.prod(extents[:-1]), extents[-1], int(a.shape[-1])
    if k % 8:
        return None
    return GemmMatch(func, a, b, out, m, n, k, b_kn, *x_value, accumulator,
                     row_norm=RowNormMatch(x, sums, *out_value))


def _element(block, buffer, extents):
    """``(iterators, value)`` of the elementwise ``block`` storing ``buffer`` (of ``extents``)
    at its iterators, else None."""
    store = block.body
    iters = tuple(iv.var for iv in block.iter_vars)
    if (reduces(block) or not isinstance(store, tvm.tirx.BufferStore)
            or not store.buffer.same_as(buffer) or not is_identity(store.indices, iters)
            or [int(iv.dom.extent) for iv in block.iter_vars] != extents):
        return None
    return iters, store.value


def _row_sum(block, x, extents):
    """``(sum buffer, iterators, term)`` of the reduction ``block``: ``S[rows] = S[rows] +
    term`` from zero, over one axis as long as a row of ``x``; else None."""
    store, init = block.body, block.init
    iters = tuple(iv.var for iv in block.iter_vars)
    kinds = [iv.iter_type for iv in block.iter_vars]
    if (not isinstance(store, tvm.tirx.BufferStore) or kinds[:-1].count(
            tvm.tirx.IterVar.DataPar) != len(kinds) - 1 or kinds[-1] == tvm.tirx.IterVar.DataPar
            or [int(iv.dom.extent) for iv in block.iter_vars] != extents
            or not is_identity(store.indices, iters[:-1]) or str(store.buffer.dtype) != "float32"
            or not isinstance(init, tvm.tirx.BufferStore)
            or not isinstance(init.value, tvm.tirx.FloatImm) or init.value.value != 0
            or not isinstance(store.value, tvm.ir.prim.expr.Add)
            or not isinstance(store.value.a, tvm.ir.TensorLoad)
            or not store.value.a.source.same_as(store.buffer)
            or not is_identity(store.value.a.indices, iters[:-1])):
        return None
    return store.buffer, iters, store.value.b


def _reads_only(value, accept) -> bool:
    """Every load in ``value`` passes ``accept``, and ``value`` is what ``rebuild`` takes."""
    loads = []
    try:
        rebuild(value, loads.append, {})
    except ValueError:
        return False
    return all(accept(load) for load in loads)


def _is_param(load, params) -> bool:
    return any(load.source.same_as(p) for p in params)


def _reads_row(load, x, sums, iters, params) -> bool:
    """``load`` reads the row element ``x`` at the block's position, a sum of ``sums`` at its
    row, or a parameter."""
    if load.source.same_as(x):
        return is_identity(load.indices, iters)
    if any(load.source.same_as(s) for s in sums):
        return is_identity(load.indices, iters[:-1])
    return _is_param(load, params)
