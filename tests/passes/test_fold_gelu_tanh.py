import math

import torch
import tvm
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import FoldGeluTanh
from tvmfuse.verify import verify

from conftest import HOST, relax_main


def _written_out(cubic: float):
    def body(bb, x):
        def c(value):
            return relax.const(value, "float32")

        cube = bb.emit(relax.op.multiply(bb.emit(relax.op.power(x, c(3.0))), c(cubic)))
        inner = bb.emit(relax.op.multiply(bb.emit(relax.op.add(x, cube)),
                                          c(math.sqrt(2.0 / math.pi))))
        gate = bb.emit(relax.op.add(bb.emit(relax.op.tanh(inner)), c(1.0)))
        return relax.op.multiply(bb.emit(relax.op.multiply(x, c(0.5))), gate)

    return body


def test_written_out_tanh_gelu_becomes_one_op():
    before = relax_main({"x": (4, 8)}, _written_out(0.044715))
    expected = relax_main({"x": (4, 8)}, lambda bb, x: relax.op.nn.gelu_tanh(x))
    tvm.ir.assert_structural_equal(FoldGeluTanh()(before), expected)


def test_other_constants_are_no_match():
    before = relax_main({"x": (4, 8)}, _written_out(0.05))
    tvm.ir.assert_structural_equal(FoldGeluTanh()(before), before)


class GPT2MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(32, 128), torch.nn.Linear(128, 32)

    def forward(self, x):
        h = self.up(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3.0)))
        return self.down(h)


def test_gpt2_mlp_gelu_is_the_up_projections_epilogue_and_matches_pytorch(tmp_path):
    torch.manual_seed(0)
    model = api.import_torch(GPT2MLP().eval(), [torch.randn(1, 37, 32) * 2])
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    rules = {g.rule for g in compiled.analysis.groups}
    assert "tvmfuse.matmul_epilogue.bias_gelu_tanh" in rules
    assert not any(g.rule == "elementwise" for g in compiled.analysis.groups)
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-5
