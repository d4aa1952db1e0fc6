"""LayerNorm (and RMSNorm) in the epilogue of the wgmma GEMM (``schedules/cuda/row_norm.py``,
``RowNorm`` in ``schedules/cuda/wgmma.py``): what the matcher reads off a fused GEMM + bias +
residual + LayerNorm, the cluster kernel's CUDA source (nvcc, sm_90a), which groups the
``layer_norm_epilogue`` rule forms on CUDA, and on a machine with an NVIDIA GPU its numbers
against NumPy at sizes no tile divides and against PyTorch through a whole build."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import te

from tvmfuse import api
from tvmfuse.schedules.cuda.row_norm import match_gemm_row_norm
from tvmfuse.verify import verify

from conftest import nvcc_compiles

SM90A = tvm.target.Target({"kind": "cuda", "arch": "sm_90a", "host": "llvm"})
GPU = tvm.cuda(0).exist
EPS = 1e-5


def _fused_norm(m, n, k, *, lead=(), rms=False, dtype="float16"):
    """A fused linear layer + bias + residual + LayerNorm (RMSNorm: ``rms``) as the fp16 builds
    legalize it: float32 sums, the row element ``x`` in ``dtype``, the statistics in float32,
    the normalized rows cast to ``dtype`` before gamma and beta."""
    a = te.placeholder((*lead, m, k), dtype, name="A")
    w = te.placeholder((k, n), dtype, name="W")
    bias, gamma, beta = (te.placeholder((n,), dtype, name=name)
                         for name in ("bias", "gamma", "beta"))
    residual = te.placeholder((*lead, m, n), dtype, name="residual")
    r = te.reduce_axis((0, k), "k")
    acc = te.compute((*lead, m, n), lambda *i: te.sum(
        a[(*i[:-1], r)].astype("float32") * w[r, i[-1]].astype("float32"), axis=r), name="matmul")
    x = te.compute(acc.shape, lambda *i: acc[i].astype(dtype) + bias[i[-1]] + residual[i],
                   name="x")
    j = te.reduce_axis((0, n), "j")
    if rms:
        squares = te.compute(acc.shape[:-1], lambda *i: te.sum(
            x[(*i, j)].astype("float32") * x[(*i, j)].astype("float32"), axis=j), name="squares")
        out = te.compute(acc.shape, lambda *i: (x[i].astype("float32") * tvm.tirx.rsqrt(
            squares[i[:-1]] / float(n) + EPS)).astype(dtype) * gamma[i[-1]], name="out")
        return te.create_prim_func([a, w, bias, residual, gamma, out])
    total = te.compute(acc.shape[:-1], lambda *i: te.sum(x[(*i, j)].astype("float32"), axis=j),
                       name="sum")
    mean = te.compute(total.shape, lambda *i: total[i] / float(n), name="mean")
    j2 = te.reduce_axis((0, n), "j2")
    var = te.compute(total.shape, lambda *i: te.sum(
        (x[(*i, j2)].astype("float32") - mean[i]) * (x[(*i, j2)].astype("float32") - mean[i]),
        axis=j2), name="var_sum")
    out = te.compute(acc.shape, lambda *i: (
        (x[i].astype("float32") - mean[i[:-1]]) * tvm.tirx.rsqrt(var[i[:-1]] / float(n) + EPS)
    ).astype(dtype) * gamma[i[-1]] + beta[i[-1]], name="out")
    return te.create_prim_func([a, w, bias, residual, gamma, beta, out])


def test_match_reads_the_row_element_its_sums_and_the_stored_value():
    found = match_gemm_row_norm(_fused_norm(197, 768, 3072, lead=(2,)))
    assert (found.m, found.n, found.k, found.b_kn) == (394, 768, 3072, True)
    assert [str(buffer.name) for buffer, _, _ in found.row_norm.sums] == ["sum", "var_sum"]
    assert str(found.row_norm.x.dtype) == "float16"
    rms = match_gemm_row_norm(_fused_norm(128, 512, 256, rms=True))
    assert [str(buffer.name) for buffer, _, _ in rms.row_norm.sums] == ["squares"]


def test_match_declines_what_the_kernel_cannot_compute():
    from tvmfuse.schedules.cuda.gemm_match import match_gemm  # noqa: PLC0415

    assert match_gemm(_fused_norm(128, 768, 768)) is None  # (a GEMM with row sums after it)
    assert match_gemm_row_norm(_fused_norm(128, 768, 768, dtype="float32"), "float16") is None
    assert match_gemm_row_norm(_fused_norm(128, 768, 764)) is None  # K % 8: TMA's rows
    with pytest.raises(ValueError, match="at most 8"):  # 4096 wide: 16 tiles, no cluster
        match_gemm_row_norm(_fused_norm(4096, 4096, 768)).kernel()


@pytest.mark.parametrize("rms", [False, True])
def test_source_has_cluster_barriers_and_remote_reads_and_nvcc_compiles_it(tmp_path, rms):
    kernel = match_gemm_row_norm(_fused_norm(4096, 768, 768, rms=rms)).kernel()
    lib = tvm.compile(tvm.IRModule({"main": kernel}), target=SM90A, tir_pipeline="tirx")
    source = lib.mod.imports[0].inspect_source()
    assert "wgmma.mma_async.sync.aligned.m64n192k16.f32.f16.f16" in source  # 4 tiles of 192
    assert "barrier.cluster.arrive.release" in source and "mapa.shared::cluster" in source
    assert "ld.shared::cluster.f32" in source
    assert "cluster_ctaid" in source
    nvcc_compiles(source, tmp_path, arch="sm_90a")


class LinearAddNorm(nn.Module):
    """BERT's FFN output: LayerNorm(FFN2(relu(FFN1(h))) + h)."""

    def __init__(self, hidden=768, inner=1024):
        super().__init__()
        self.up, self.down = nn.Linear(hidden, inner), nn.Linear(inner, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, h):
        return self.norm(self.down(torch.relu(self.up(h))) + h)


def _linear_add_norm(rows):
    torch.manual_seed(0)
    return api.import_torch(LinearAddNorm().eval(), [torch.randn(1, rows, 768)])


def _rule_on(folder):
    """``[cuda] layer_norm_epilogue`` on (off by default: see fusion_rules.toml)."""
    path = folder / "rules.toml"
    path.write_text("[cuda]\nlayer_norm_epilogue = { enabled = true }\n")
    return path


@pytest.mark.parametrize("rows,fused", [(4096, True), (128, False)])
def test_cuda_fuses_layer_norm_into_the_gemms_the_wgmma_kernel_takes(rows, fused, tmp_path):
    """With the rule on, at 4096 rows the GEMM + bias + residual + LayerNorm is one wgmma
    kernel; at 128 (too few rows for wgmma) the group is not formed and the LayerNorm keeps
    its own kernel."""
    compiled = api.compile_model(_linear_add_norm(rows), api.get_target("cuda-sm90"),
                                 api.BuildOptions(use_database=False, dtype="float16",
                                                  fusion_rules=_rule_on(tmp_path)))
    rules = [group.rule for group in compiled.analysis.groups]
    assert ("tvmfuse.layer_norm_epilogue.bias_add" in rules) == fused
    norm = [name for name in compiled.analysis.kernels if "layer_norm" in name]
    assert len(norm) == 1
    assert (compiled.analysis.implementations[norm[0]] == "cuda.wgmma_gemm") == fused


def _reference(a, w, bias, residual, gamma, beta, rms):
    """NumPy with the kernel's roundings: the GEMM's sums and the statistics in float32, the
    row element and the normalized rows in the input type."""
    store = a.dtype
    x = ((a.astype("float32") @ w.astype("float32")).astype(store) + bias).astype(
        store) + residual
    x = x.astype(store).astype("float32")
    if rms:
        normed = x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)
        return (normed.astype(store) * gamma).astype("float32")
    centred = x - x.mean(-1, keepdims=True)
    normed = centred / np.sqrt((centred * centred).mean(-1, keepdims=True) + EPS)
    return (normed.astype(store) * gamma + beta).astype("float32")


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (run on the GPU host)")
@pytest.mark.parametrize("m,n,k,lead,rms,dtype", [
    (4096, 768, 768, (), False, "float16"),  # BERT-base's attention output, 4 tiles of 192
    (2000, 1000, 520, (), False, "float16"),  # 8 tiles of 128 (a full cluster), the last
    #                                            partial, a partial last tile of rows
    (2048, 1000, 256, (2,), False, "float16"),  # one-consumer tiles (K of 4 steps), 8 of 128
    (4096, 768, 3072, (), False, "bfloat16"),
    (600, 512, 384, (), True, "float16"),
])
def test_numbers_against_numpy(m, n, k, lead, rms, dtype):
    found = match_gemm_row_norm(_fused_norm(m, n, k, lead=lead, rms=rms, dtype=dtype), dtype)
    lib = tvm.compile(tvm.IRModule({"main": found.kernel()}), target=SM90A, tir_pipeline="tirx")
    rng = np.random.default_rng(m + n + k)
    store = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    a = rng.standard_normal((*lead, m, k)).astype(store)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(store)
    bias, gamma, beta = (rng.standard_normal(n).astype(store) for _ in range(3))
    residual = rng.standard_normal((*lead, m, n)).astype(store)
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((*lead, m, n), np.nan, store), dev)
    args = [a, np.ascontiguousarray(w.T), bias, residual, gamma] + ([] if rms else [beta])
    lib["main"](*(tvm.runtime.tensor(x, dev) for x in args), out)
    got = out.numpy().astype("float32")
    want = _reference(a, w, bias, residual, gamma, beta, rms)
    assert np.isfinite(got).all(), "outputs left unwritten"
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < (
        2e-3 if dtype == "float16" else 1e-2)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (run on the GPU host)")
def test_a_build_with_the_fused_layer_norm_verifies_against_pytorch(tmp_path):
    model = _linear_add_norm(4096)
    compiled = api.compile_model(model, api.get_target("cuda-sm90"),
                                 api.BuildOptions(use_database=False, dtype="float16",
                                                  fusion_rules=_rule_on(tmp_path)))
    assert "cuda.wgmma_gemm" in compiled.analysis.implementations.values()
    checks = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert max(c.rel_err for c in checks) < 1e-2
