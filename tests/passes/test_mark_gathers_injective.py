import torch
import tvm
from torch import nn
from tvm import relax
from tvm.script import tirx as T

from tvmfuse import api
from tvmfuse.names import INJECTIVE, OPAQUE
from tvmfuse.passes import MarkGathersInjective
from tvmfuse.verify import verify

from conftest import HOST


class Embeddings(nn.Module):
    """BERT's embeddings: a word lookup, constant position and token-type rows, LayerNorm."""

    def __init__(self):
        super().__init__()
        self.word, self.position = nn.Embedding(100, 32), nn.Embedding(16, 32)
        self.norm = nn.LayerNorm(32)
        self.register_buffer("positions", torch.arange(16)[None])

    def forward(self, ids):
        return self.norm(self.word(ids) + self.position(self.positions))


def _legalized(module, inputs):
    model = api.import_torch(module.eval(), inputs)
    with api.get_target(HOST).tvm_target():
        mod = relax.transform.LegalizeOps()(model.mod)
        return relax.transform.AnnotateTIROpPattern()(mod)


def _patterns(mod):
    return {g.name_hint: int(f.attrs["op_pattern"]) for g, f in mod.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc) and "op_pattern" in f.attrs}


def test_take_becomes_injective():
    before = _legalized(Embeddings(), [torch.randint(0, 100, (1, 16))])
    patterns = _patterns(before)
    assert patterns["take"] == OPAQUE  # what AnnotateTIROpPattern says
    after = _patterns(MarkGathersInjective()(before))
    assert all(after[k] == INJECTIVE for k in patterns if k.startswith("take"))
    assert all(after[k] == v for k, v in patterns.items() if not k.startswith("take"))


@T.prim_func(s_tir=True)
def gather(a: T.Buffer((16,), "float32"), idx: T.Buffer((16,), "int32"),
           out: T.Buffer((16,), "float32")):
    T.func_attr({"op_pattern": 8})
    for i in range(16):
        with T.sblock("gather"):
            vi = T.axis.spatial(16, i)
            out[vi] = a[idx[vi]]


@T.prim_func(s_tir=True)
def scatter(a: T.Buffer((16,), "float32"), idx: T.Buffer((16,), "int32"),
            out: T.Buffer((16,), "float32")):
    T.func_attr({"op_pattern": 8})
    for i in range(16):
        with T.sblock("scatter"):
            vi = T.axis.spatial(16, i)
            out[idx[vi]] = a[vi]


def test_a_gather_is_retagged_and_a_scatter_is_not():
    after = MarkGathersInjective()(tvm.IRModule({"gather": gather, "scatter": scatter}))
    assert _patterns(after) == {"gather": INJECTIVE, "scatter": OPAQUE}


def test_embedding_lookup_joins_its_add_and_numbers_match(tmp_path):
    ids = torch.randint(0, 100, (1, 16))
    model = api.import_torch(Embeddings().eval(), [ids])
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    # the ids' cast and the lookup in one kernel, the position add and LayerNorm in another
    assert len(compiled.analysis.kernels) == 2
    assert any(g.ops[:3] == ("cast", "reshape", "take") for g in compiled.analysis.groups)
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-6
