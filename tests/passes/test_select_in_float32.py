import numpy as np
import torch
import tvm
from torch import nn
from tvm import relax
from tvm.script import relax as R

from tvmfuse import api
from tvmfuse.passes import SelectInFloat32

from conftest import HOST


class Router(nn.Module):
    """A mixture-of-experts router: which of four experts a token goes to. Experts 0 and 1
    score 0.30000 and 0.30002 in float32, 2e-5 apart; in float16 the weights round apart
    (0.300049 and 0.299805, a step below and above the tie) and the bias cannot make up the
    difference, so a float16 GEMM chooses expert 0."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(2, 4)
        with torch.no_grad():
            self.gate.weight.copy_(torch.tensor([[0.3, 0.0], [0.29992, 0.0], [0.1, 0.0],
                                                 [0.0, 0.1]]))
            self.gate.bias.copy_(torch.tensor([0.0, 1e-4, 0.0, 0.0]))

    def forward(self, x):
        return torch.topk(self.gate(x), 1).indices.float()


def _narrowed(mod: tvm.IRModule) -> tvm.IRModule:
    return relax.transform.ToMixedPrecision(out_dtype="float16")(mod)


def test_the_gemm_a_selection_reads_is_computed_again_in_float32():
    """After ToMixedPrecision the router's GEMM is float16 over float16 weights; the pass
    recomputes it from the float32 activation and the float32 weight (through its transpose)
    and bias, the constants of the casts ToMixedPrecision left."""
    x = torch.tensor([[1.0, 1.0]])
    before = _narrowed(api.import_torch(Router().eval(), [x]).mod)
    weight, bias = (c.value.numpy() for c in _constants(before))

    @R.function
    def expected(x: R.Tensor((1, 2), "float32")) -> R.Tuple(R.Tensor((1, 1), "float32")):
        with R.dataflow():
            w = R.permute_dims(R.const(weight), axes=[1, 0])
            logits = R.add(R.const(bias), R.matmul(x, w, out_dtype="float32"))
            top = R.topk(logits, k=1, axis=-1, ret_type="both", largest=True, dtype="int64")
            gv = (R.astype(top[1], "float32"),)
            R.output(gv)
        return gv

    after = relax.transform.Normalize()(SelectInFloat32()(before))
    tvm.ir.assert_structural_equal(
        after["main"], relax.transform.Normalize()(
        tvm.IRModule({"main": expected.with_attr("global_symbol", "main")}))["main"])


def _constants(mod):
    found = []
    relax.analysis.post_order_visit(
        mod["main"], lambda e: found.append(e) if isinstance(e, tvm.ir.expr.GenericConst) else None)
    return found


def test_a_selection_of_values_no_gemm_computed_is_left_alone():
    """A top-k over an input (or anything not a narrowed GEMM) has nothing to recompute."""

    class TopOfInput(nn.Module):
        def forward(self, x):
            return torch.topk(torch.softmax(x * 2.0, dim=-1), 2).values

    before = _narrowed(api.import_torch(TopOfInput().eval(), [torch.randn(3, 8)]).mod)
    tvm.ir.assert_structural_equal(SelectInFloat32()(before), before)


def test_an_fp16_build_routes_as_pytorch_does_in_float32(tmp_path):
    """The float16 build picks expert 1, as the float32 model does (PyTorch's own float16 GEMM
    picks expert 0)."""
    module, x = Router().eval(), torch.tensor([[1.0, 1.0]])
    with torch.no_grad():
        assert module(x).item() == 1.0
        assert module.half()(x.half()).item() == 0.0
    module = Router().eval()
    compiled = api.compile_model(api.import_torch(module, [x]), api.get_target(HOST),
                                 api.BuildOptions(use_database=False, dtype="float16"))
    (out,) = api.load(api.build(compiled, tmp_path / "out")).run([x.numpy()])
    np.testing.assert_array_equal(out, [[1.0]])


class NormedRouter(nn.Module):
    """A router over a LayerNorm's output that the residual stream reads too: the value
    StoreNarrowed stores narrowed (its other readers widen the float16 copy)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.gate = nn.Linear(8, 4)

    def forward(self, x):
        h = self.norm(x)
        return h + 1.0, torch.topk(self.gate(h), 2).indices.float()


def test_the_router_reads_the_float32_norm_where_the_stream_is_stored_narrowed(tmp_path):
    """Under rules that store the residual stream narrowed (x86-64's, CUDA's), the float32 GEMM
    still reads the LayerNorm's float32 output, not its float16 copy widened again."""
    torch.manual_seed(0)
    module, x = NormedRouter().eval(), torch.randn(3, 8)
    api.compile_model(api.import_torch(module, [x]), api.get_target("x86-64"),
                      api.BuildOptions(use_database=False, dtype="float16", dump_ir=tmp_path))
    lines = (tmp_path / "01_fold.py").read_text().splitlines()
    binding = {line.split(":")[0].strip(): line for line in lines if " = " in line}
    (matmul,) = [line for line in lines if "R.matmul(" in line and 'out_dtype="float32"' in line]
    activation = matmul.split("R.matmul(")[1].split(",")[0]
    assert "R.astype(" not in binding[activation], binding[activation]
    assert any("R.astype(" in line and 'dtype="float16"' in line for line in lines)
