import numpy as np
import pytest
import torch
import tvm
from torch import nn

from tvmfuse import api, pipeline
from tvmfuse.names import FUSION as FUSION_ATTR
from tvmfuse.passes import FuseAttention
from tvmfuse.schedules.cpu.attention import attention_kernel
from tvmfuse.shapes import AttentionShape
from tvmfuse.verify import verify

from conftest import HOST

TARGET = api.get_target(HOST)


class Attention(nn.Module):
    """Self-attention as BERT writes it: Q, K, V projections, heads split and merged."""

    def __init__(self, dim=32, heads=4, scale=None, mask=True):
        super().__init__()
        self.heads, self.mask = heads, mask
        self.scale = scale if scale is not None else (dim // heads) ** -0.5
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))

    def forward(self, x, mask):
        b, s, d = x.shape

        def split(t):
            return t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        return (self.probs(q, k, mask) @ v).transpose(1, 2).reshape(b, s, d)

    def probs(self, q, k, mask):
        scores = q @ k.transpose(-1, -2) * self.scale
        if self.mask:
            scores = scores + mask
        return torch.softmax(scores, dim=-1)


def _inputs(batch=2, seq=12, dim=32, mask_shape=None, masked=0.3):
    torch.manual_seed(0)
    mask_shape = mask_shape or (batch, 1, 1, seq)
    mask = torch.where(torch.rand(mask_shape) < masked, torch.finfo(torch.float32).min, 0.0)
    return [torch.randn(batch, seq, dim), mask]


def _folded(model, rules_file=None):
    return pipeline.run(model.mod, TARGET, api.BuildOptions(fusion_rules=rules_file),
                        until="fold")


def _off(tmp_path, rule):
    """A rules file that turns ``rule`` off."""
    path = tmp_path / "rules.toml"
    path.write_text(f"[default]\n{rule} = {{ enabled = false }}\n")
    return path


def _calls(mod):
    names = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            op = getattr(binding.value, "op", None)
            if op is not None:
                names.append(getattr(op, "name", None))
    return names


def test_attention_chain_becomes_one_kernel_reading_the_packed_qkv():
    model = api.import_torch(Attention().eval(), _inputs())
    mod = _folded(model)
    calls = _calls(mod)
    # the merged QKV GEMM and its bias, then the kernel: no slice, view, matmul or softmax left
    assert calls == ["relax.matmul", "relax.add", "relax.call_tir"]
    (attention,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert str(attention.attrs[FUSION_ATTR]) == "tvmfuse.fused_attention"
    bindings = mod["main"].body.blocks[0].bindings
    qkv, call = bindings[1].var, bindings[2].value
    q, k, v, mask = call.args[1].fields
    assert q.same_as(qkv) and k.same_as(qkv) and v.same_as(qkv)  # read at offsets 0, 32, 64
    assert mask.same_as(mod["main"].params[1])


def test_separate_projections_are_read_where_they_are(tmp_path):
    model = api.import_torch(Attention().eval(), _inputs())
    mod = _folded(model, _off(tmp_path, "horizontal_matmul"))
    assert _calls(mod).count("relax.call_tir") == 1 and _calls(mod).count("relax.matmul") == 3


@pytest.mark.parametrize("module, why", [
    (Attention(scale=1.0, mask=False), "unscaled and unmasked: still attention"),
])
def test_unscaled_unmasked_attention_is_fused_too(module, why):
    model = api.import_torch(module.eval(), _inputs())
    assert "relax.call_tir" in _calls(_folded(model)), why


class SoftmaxOverQueries(Attention):
    def probs(self, q, k, mask):
        return torch.softmax(q @ k.transpose(-1, -2) * self.scale + mask, dim=-2)


class ScaleByTensor(Attention):
    def probs(self, q, k, mask):
        return torch.softmax(q @ k.transpose(-1, -2) * mask, dim=-1)  # not a constant scale


@pytest.mark.parametrize("module", [SoftmaxOverQueries(), ScaleByTensor()],
                         ids=["softmax-not-on-keys", "scale-not-constant"])
def test_other_chains_are_no_match(module, tmp_path):
    model = api.import_torch(module.eval(), _inputs())
    mod = _folded(model, _off(tmp_path, "fused_attention"))
    before = FuseAttention(attention_kernel)(mod)  # what the pass sees in the pipeline
    tvm.ir.assert_structural_equal(before, mod)
    assert "relax.nn.softmax" in _calls(mod)


def test_rule_off_keeps_the_chain(tmp_path):
    model = api.import_torch(Attention().eval(), _inputs())
    mod = _folded(model, _off(tmp_path, "fused_attention"))
    assert "relax.call_tir" not in _calls(mod) and "relax.nn.softmax" in _calls(mod)


@pytest.mark.parametrize("mask_shape, masked", [
    ((2, 1, 1, 12), 0.3),   # BERT's padding mask
    ((2, 1, 12, 12), 0.3),  # a mask per query (causal or the newer transformers form)
    ((1, 1, 1, 12), 1.0),   # every key masked: softmax is uniform, as in PyTorch
])
def test_numbers_match_pytorch(tmp_path, mask_shape, masked):
    inputs = _inputs(mask_shape=mask_shape, masked=masked)
    model = api.import_torch(Attention().eval(), inputs)
    compiled = api.compile_model(model, TARGET, api.BuildOptions())
    assert any(g.rule == "tvmfuse.fused_attention" for g in compiled.analysis.groups)
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-5


@pytest.mark.parametrize("cores", [1, 2, 4])
@pytest.mark.parametrize("seq", [1, 7, 12, 48, 77, 128, 197])
def test_kernel_alone_against_numpy(seq, cores):
    """The kernel over tile sizes (a sequence of 7 has tiles of 1; more cores, smaller query
    tiles; at this head size 77 keys are one tile of five vectors, 197 three, the last partial),
    offsets and a float16 store."""
    _against_numpy(lambda shape: attention_kernel(shape, cores=cores), TARGET.tvm_target(),
                   tvm.cpu(), seq, dim=16)


@pytest.mark.parametrize("dim", [16, 32, 20])
@pytest.mark.parametrize("seq", [1, 7, 12, 48, 77, 128, 197])
def test_kernel_for_sixteen_registers_against_numpy(seq, dim):
    """AVX2's configuration (8 lanes, 16 registers): six rows, scores two key vectors a pass
    over the head (tiles of up to eight vectors: several passes), outputs two vectors a pass
    over the keys (a head of 32: two passes; of 20, not whole vectors: one)."""
    _against_numpy(lambda shape: attention_kernel(shape, lanes=8, registers=16, cores=2),
                   TARGET.tvm_target(), tvm.cpu(), seq, dim=dim)


@pytest.mark.skipif(not tvm.cuda(0).exist, reason="needs a CUDA GPU (run on the GPU host)")
@pytest.mark.parametrize("seq, dim", [(1, 16), (7, 16), (48, 80), (128, 64), (200, 64)])
def test_cuda_kernel_alone_against_numpy(seq, dim):
    """Warps over partial key tiles (7, 48, 200 keys) and head dimensions that are not a multiple
    of the warp (16: lanes idle; 80: three dimensions per lane, the last partial)."""
    from tvmfuse.schedules.cuda.attention import simt_attention_kernel

    _against_numpy(simt_attention_kernel, api.get_target("cuda-sm90").tvm_target(), tvm.cuda(0),
                   seq, dim)


def _against_numpy(make_kernel, target, device, seq: int, dim: int):
    batch, heads = 2, 3
    rng = np.random.default_rng(seq)
    for dtype, tolerance in (("float32", 1e-5), ("float16", 2e-3)):
        shape = AttentionShape(batch, seq, heads, dim, q=(3 * heads * dim + 8, 8),
                               k=(3 * heads * dim + 8, 8 + heads * dim),
                               v=(heads * dim, 0), mask=(batch, 1, 1, seq), scale=0.3, dtype=dtype)
        qk = rng.standard_normal((batch, seq, 3 * heads * dim + 8)).astype(dtype)
        v = rng.standard_normal((batch, seq, heads * dim)).astype(dtype)
        mask = np.where(rng.random((batch, 1, 1, seq)) < 0.2, -1e4, 0).astype(dtype)
        lib = tvm.compile(tvm.IRModule({"main": make_kernel(shape).with_attr(
            "global_symbol", "main")}), target=target)
        args = [tvm.runtime.tensor(a, device) for a in (qk, qk, v, mask)]
        out = tvm.runtime.tensor(np.zeros((batch, seq, heads * dim), dtype), device)
        lib["main"](*args, out)

        def heads_of(x, offset):
            part = x[..., offset:offset + heads * dim].astype("float32")
            return part.reshape(batch, seq, heads, dim).transpose(0, 2, 1, 3)

        q, k, vh = heads_of(qk, 8), heads_of(qk, 8 + heads * dim), heads_of(v, 0)
        scores = q @ k.transpose(0, 1, 3, 2) * 0.3 + mask.astype("float32")
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        want = (probs @ vh).transpose(0, 2, 1, 3).reshape(batch, seq, heads * dim)
        got = out.numpy().astype("float32")
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < tolerance, dtype


def test_cuda_kernel_builds_and_its_rule_turns_it_off(tmp_path):
    """The CUDA kernel generates code here (its numbers are checked on the GPU host, above);
    the rule turns it off per target."""
    model = api.import_torch(Attention().eval(), _inputs())
    target = api.get_target("cuda-sm90")
    shipped = api.compile_model(model, target, api.BuildOptions())
    assert shipped.analysis.implementations["attention"] == "cuda.attention"
    off = tmp_path / "off.toml"
    off.write_text("[cuda]\nfused_attention = { enabled = false }\n")
    compiled = api.compile_model(model, target, api.BuildOptions(fusion_rules=off))
    assert "attention" not in compiled.analysis.implementations

def test_cuda_takes_fp16_attention_on_tensor_cores():
    """BERT-base's float16 attention goes to the tensor-core kernel at any batch; float32 to
    the SIMT kernel, which alone would leave large float16 attention unfused (its batched
    matmuls on the mma GEMM)."""
    from tvmfuse.schedules.cuda import attention, flash_attention

    def shape(batch, dtype):
        return AttentionShape(batch=batch, seq=128, kv_seq=128, heads=12, head_dim=64,
                              q=(2304, 0), k=(2304, 768), v=(2304, 1536), mask=(batch, 1, 1, 128),
                              scale=0.125, dtype=dtype)

    for batch in (1, 32):
        kernel = attention.attention_kernel(shape(batch, "float16"))
        assert kernel.attrs["tvmfuse.schedule"] == flash_attention.NAME
    assert attention.simt_attention_kernel(shape(32, "float16")) is None
    assert attention.simt_attention_kernel(shape(1, "float16")) is not None
    assert attention.attention_kernel(shape(32, "float32")).attrs["tvmfuse.schedule"] \
        == attention.NAME


@pytest.mark.parametrize("seq", [1, 7, 49, 50, 197])
def test_numbers_match_pytorch_at_sequences_no_tile_divides(tmp_path, seq):
    """The kernel keeps its 4-row and 16-to-64-key tiles at any length: the last tiles read
    clamped rows and weigh the keys past the end 0 (a per-query mask, so that a mask read at
    a wrong row or key would show)."""
    inputs = _inputs(batch=1, seq=seq, mask_shape=(1, 1, seq, seq), masked=0.3)
    inputs[1][..., 0] = 0.0  # every query sees at least one key
    model = api.import_torch(Attention().eval(), inputs)
    compiled = api.compile_model(model, TARGET, api.BuildOptions(use_database=False))
    assert any(g.rule == "tvmfuse.fused_attention" for g in compiled.analysis.groups)
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-5
