"""DropUnusedShapeCasts: the shape a ``.item()`` read, when nothing reads it, is not computed.

A model that checks a value it reads with ``.item()`` (FlauBERT asserts its longest sequence fits:
``assert lengths.max().item() <= slen``) exports the read without the check. TVM's importer
makes it ``R.match_cast(R.tensor_to_shape(x), R.Shape([n]))``, binding a symbolic ``n`` nothing
uses; DeadCodeElimination keeps a ``match_cast`` (it defines ``n``), and ToMixedPrecision then
stops on the shape ("Expected TensorType, but got R.Shape(ndim=1)"): FlauBERT built in float32
and not in float16. The cast goes where neither its variable nor the symbols it defines are read;
the conversion behind it is then dead code.

Preconditions: none (any Relax module; a function the drop would leave ill-formed is kept).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._rewrite import mutate_functions, var_uses


@tvm.transform.module_pass(opt_level=0, name="DropUnusedShapeCasts")
class DropUnusedShapeCasts:
    """Drop unread ``match_cast`` s to shapes and scalars; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        unused = set()
        for func in mod.functions.values():
            if isinstance(func, relax.Function):
                uses = var_uses(func)
                unused.update(binding.var for block in func.body.blocks
                              for binding in block.bindings
                              if isinstance(binding, relax.MatchCast) and uses[binding.var] == 0
                              and isinstance(binding.ty, (relax.ShapeType, tvm.ir.PrimType)))
        if not unused:
            return mod
        dropped = mutate_functions(mod, _Drop(mod, unused))
        return dropped if relax.analysis.check_well_formed(dropped) else mod


@relax.expr_functor.mutator
class _Drop(relax.PyExprMutator):
    """Re-emits every binding but the ``match_cast`` s of the variables ``unused``."""

    def __init__(self, mod: tvm.IRModule, unused: set):
        super().__init__(mod)
        self.unused = unused

    def visit_match_cast_(self, binding: relax.MatchCast) -> None:
        if binding.var not in self.unused:
            super().visit_match_cast_(binding)
