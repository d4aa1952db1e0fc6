import pytest
import tvm
from tvm import relax

from tvmfuse import api, pipeline
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
    with pytest.raises(CompileError, match=r"phase 4 \(legalize\): TVM has no lowering for "
                                           r"cumsum \(x1\)"):
        pipeline.run(mod, api.get_target(HOST), api.BuildOptions())


def test_a_build_derives_its_strategy_and_tvm_target_once(monkeypatch):
    """One build looks up the target's strategy once, the groups VerifyFusion builds on the way
    and the final lowering included; a TargetSpec builds its TVM target once."""
    import torch

    from tvmfuse import strategy

    looked_up = []
    for_target = strategy.for_target
    monkeypatch.setattr(strategy, "for_target", lambda t: looked_up.append(t) or for_target(t))
    target = api.get_target(HOST)
    model = api.import_torch(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(),
                             [torch.randn(2, 8)])
    compiled = api.compile_model(model, target,
                                 api.BuildOptions(use_database=False, verify_fusion=True))
    assert compiled.analysis.groups  # built by VerifyFusion, with the run's strategy
    assert looked_up == [target]
    assert target.tvm_target() is target.tvm_target()
