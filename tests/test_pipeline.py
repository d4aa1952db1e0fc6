import pytest
import tvm
from tvm import relax

from tvmfuse import api, pipeline, rules
from tvmfuse.errors import CompileError

from conftest import HOST, relax_main


def test_operators_left_after_legalization_are_counted_by_name():
    mod = relax_main({"x": (4, 8)}, lambda bb, x: relax.op.cumsum(
        bb.emit(relax.op.cumsum(x, axis=1)), axis=0))
    with tvm.target.Target("llvm"):
        legalized = relax.transform.LegalizeOps()(mod)  # no lowering for cumsum: TVM dispatches it
    assert pipeline.unlowered_operators(legalized) == {"cumsum": 2}
    add = relax_main({"x": (4, 8)}, lambda bb, x: relax.op.add(x, x))
    with tvm.target.Target("llvm"):
        assert not pipeline.unlowered_operators(relax.transform.LegalizeOps()(add))


def test_the_legalize_phase_names_an_operator_it_leaves(monkeypatch):
    """A build stops after phase 4 with the operator named, not in VM codegen with "CodeGenVM
    cannot emit this Relax operator directly". (Without TVM's scan dispatch, a cumsum is such
    an operator.)"""
    monkeypatch.setattr(pipeline, "_dispatch_scans", lambda *_: tvm.transform.Sequential([]))
    mod = relax_main({"x": (4, 8)}, lambda bb, x: relax.op.cumsum(x, axis=1))
    options = pipeline.PipelineOptions(rules=rules.load_rules(HOST))
    with pytest.raises(CompileError, match=r"phase 4 \(legalize\): TVM has no lowering for "
                                           r"cumsum \(x1\)"):
        pipeline.run(mod, api.get_target(HOST), options)
