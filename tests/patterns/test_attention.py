import torch
from torch import nn

from tvmfuse import api
from tvmfuse.verify import verify

from conftest import HOST


class Scores(nn.Module):
    def forward(self, q, k, mask):
        scores = (q @ k.transpose(-1, -2)) * 0.125 + mask
        return torch.softmax(scores, dim=-1)


def test_scale_mask_softmax_is_one_kernel(tmp_path):
    torch.manual_seed(0)
    args = [torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 1, 1, 16)]
    model = api.import_torch(Scores(), args)
    _, analysis = api.analyze(model, api.get_target(HOST), api.BuildOptions())
    softmax = next(g for g in analysis.groups if "softmax" in g.ops)
    assert softmax.rule.startswith("tvmfuse.scale_mask_softmax.")
    assert softmax.ops[-1] == "softmax" and {"multiply", "add"} <= set(softmax.ops)
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    verify(api.load(api.build(compiled, tmp_path / "out")), model)


def test_softmax_without_scale_and_mask_is_no_match():
    model = api.import_torch(nn.Softmax(dim=-1), [torch.randn(2, 16)])
    _, analysis = api.analyze(model, api.get_target(HOST), api.BuildOptions())
    assert not any(g.rule.startswith("tvmfuse.scale_mask_softmax") for g in analysis.groups)


def test_head_matmul_reads_q_and_v_through_the_head_split_on_cuda(tmp_path):
    """With the attention unfused (large fp16 attention on CUDA; forced off here), the two
    batched matmuls take the head split of Q and V into their tensor-core kernels: no copy kernel
    for either; K^T (a transpose) and the head merge stay copies."""
    rules = tmp_path / "rules.toml"
    rules.write_text("[cuda]\nfused_attention = { enabled = false }\n")
    compiled = api.compile_model(api.import_model("tiny-transformer"), api.get_target("cuda-sm90"),
                                 api.BuildOptions(use_database=False, dtype="float16",
                                                  fusion_rules=rules))
    implementations = compiled.analysis.implementations
    heads = [k for k in implementations if "strided_slice" in k and "matmul" in k]
    assert len(heads) == 2 and {implementations[k] for k in heads} == {"cuda.mma_matmul"}
    assert len([k for k in implementations if "transpose" in k]) == 2
