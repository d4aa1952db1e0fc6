"""MergeParallelMatmul: matmuls that share an input become one GEMM over concatenated weights.

Q, K and V projections (or gate and up) read the same activation with three constant weights:
``matmul(x, Wq) + bq``, ``matmul(x, Wk) + bk``, ``matmul(x, Wv) + bv`` become one
``matmul(x, [Wq Wk Wv]) + [bq bk bv]`` and a slice per consumer. The activation is read once,
one kernel runs instead of three, and each slice fuses into what consumes it (the head split).

Preconditions: after FoldMatmulReshape (linear layers as one matmul), before LegalizeOps. Only
constant 2-D weights, all with a per-column constant bias or all without, are merged.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from ._rewrite import calls_op


@dataclass
class _Branch:
    matmul: relax.Var
    #: The constant weight as TVM holds it: read into NumPy only for a merge (a transformer's
    #: every matmul is a candidate, and copying them all cost BERT-base 0.8 s of its build)
    weight: tvm.runtime.Tensor
    bias_add: relax.Var | None = None
    bias: np.ndarray | None = None

    @property
    def output(self) -> relax.Var:
        return self.bias_add if self.bias_add is not None else self.matmul


@dataclass
class _Merge:
    data: relax.Expr
    attrs: object
    branches: list[_Branch] = field(default_factory=list)


@tvm.transform.module_pass(opt_level=0, name="MergeParallelMatmul")
class MergeParallelMatmul:
    """Merge matmuls that share their input; see the module docstring.

    Parameters
    ----------
    max_branches : int
        Most matmuls merged into one GEMM.
    """

    def __init__(self, max_branches: int = 8):
        self.max_branches = max_branches

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updated = mod.clone()
        for gvar, func in mod.functions.items():
            if isinstance(func, relax.Function) and not func.attrs.get("Primitive", False):
                merges = _plan(func, self.max_branches)
                if merges:
                    updated[gvar] = _Rewriter(updated, merges).visit_expr(func)
        return relax.transform.DeadCodeElimination()(updated)


def _plan(func: relax.Function, max_branches: int) -> dict[relax.Var, _Merge]:
    """Groups of mergeable matmuls, keyed by the first matmul's variable."""
    merges = {}
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        users = relax.analysis.udchain(block)
        by_input = defaultdict(list)
        for binding in block.bindings:
            branch = _branch(binding, block, users)
            if branch is not None:
                by_input[binding.value.args[0]].append((binding.value, branch))
        for data, found in by_input.items():
            calls = [c for c, _ in found]
            same_kind = {(str(c.attrs.out_dtype), b.bias is None, str(b.weight.dtype),
                          int(b.weight.shape[0])) for c, b in found}
            if len(found) < 2 or len(same_kind) != 1:
                continue
            branches = [b for _, b in found][:max_branches]
            merges[branches[0].matmul] = _Merge(data, calls[0].attrs, branches)
    return merges


def _branch(binding, block, users) -> _Branch | None:
    value = binding.value
    if not (calls_op(value, "relax.matmul") and isinstance(binding.var, relax.DataflowVar)):
        return None
    data, weight = value.args
    if not isinstance(data, relax.Var) or not _is_constant(weight) or weight.value.ndim != 2:
        return None
    w = weight.value
    branch = _Branch(binding.var, w)
    consumers = users.get(binding.var, [])
    if len(consumers) == 1:
        add = _binding_of(block, consumers[0])
        if add is not None and calls_op(add.value, "relax.add"):
            other = [a for a in add.value.args if not a.same_as(binding.var)]
            if (len(other) == 1 and _is_constant(other[0])
                    and int(np.prod(other[0].value.shape)) == int(w.shape[1])
                    and isinstance(add.var, relax.DataflowVar)):
                branch.bias_add, branch.bias = add.var, other[0].value.numpy().reshape(-1)
    return branch


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, merges: dict[relax.Var, _Merge]):
        super().__init__(mod)
        self.merges = merges
        self.dropped = {v for m in merges.values() for b in m.branches
                        for v in (b.matmul, b.bias_add) if v is not None}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        merge = self.merges.get(binding.var)
        if merge is not None:
            self._emit_merged(merge)
        elif binding.var not in self.dropped:
            super().visit_var_binding_(binding)

    def _emit_merged(self, merge: _Merge) -> None:
        weight = np.concatenate([b.weight.numpy() for b in merge.branches], axis=1)
        out = self.builder_.emit(relax.Call(tvm.ir.Op.get("relax.matmul"),
                                            [self.visit_expr(merge.data), relax.const(weight)],
                                            merge.attrs))
        if merge.branches[0].bias is not None:
            bias = np.concatenate([b.bias for b in merge.branches]).astype(weight.dtype)
            out = self.builder_.emit(relax.op.add(out, relax.const(bias)))
        axis, offset = out.ty.ndim - 1, 0
        for branch in merge.branches:
            width = int(branch.weight.shape[1])
            part = self.builder_.emit(
                relax.op.strided_slice(out, [axis], [offset], [offset + width]))
            self.set_var_remap(branch.output, part)
            offset += width


def _is_constant(expr) -> bool:
    return isinstance(expr, tvm.ir.expr.GenericConst)


def _binding_of(block, var):
    for binding in block.bindings:
        if binding.var.same_as(var):
            return binding
    return None
