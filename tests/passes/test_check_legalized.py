import pytest
import tvm
from tvm import relax

from tvmfuse.errors import CompileError
from tvmfuse.passes import CheckLegalized

from conftest import relax_main


def test_an_operator_left_unlowered_is_named_with_its_count():
    mod = relax_main({"x": (4, 8)}, lambda bb, x: relax.op.cumsum(
        bb.emit(relax.op.cumsum(x, axis=1)), axis=0))
    with pytest.raises(CompileError, match=r"TVM has no lowering for cumsum \(x2\)"):
        CheckLegalized()(mod)


def test_a_legalized_module_passes_unchanged():
    mod = relax_main({"x": (4, 8)}, lambda bb, x: relax.op.add(x, x))
    with tvm.target.Target("llvm"):
        legalized = relax.transform.LegalizeOps()(mod)
    tvm.ir.assert_structural_equal(CheckLegalized()(legalized), legalized)
