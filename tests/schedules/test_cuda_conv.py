"""fp16 convs on tensor cores (the CUDA strategy's NHWC/OHWI layout and ``schedules/cuda/
matmul.py`` as an implicit GEMM): which convs a CUDA build gives the mma schedule, the source it
generates (compiled with nvcc here), and, on a machine with an NVIDIA GPU, the model's numbers
against PyTorch float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm

from tvmfuse import api
from tvmfuse.compiler import cuda_source
from tvmfuse.passes.space_to_depth_conv import INPUT_TRANSFORM
from tvmfuse.schedules.cuda.matmul import NAME

from conftest import nvcc_compiles

CUDA = api.get_target("cuda-sm90")
GPU = tvm.cuda(0).exist


class OddConvs(torch.nn.Module):
    """Every kind of conv a CNN has, at sizes no tile divides: a 7x7 stride-2 stem over 3
    channels, a 3x3 over 24 -> 40 channels, a strided 1x1, a depthwise 3x3 (which the mma
    schedule leaves: one output channel a group) and a residual add, on a 45 x 45 image."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 24, 7, stride=2, padding=3, bias=False)
        self.bn = torch.nn.BatchNorm2d(24)
        self.conv = torch.nn.Conv2d(24, 40, 3, padding=1)
        self.down = torch.nn.Conv2d(40, 56, 1, stride=2)
        self.depthwise = torch.nn.Conv2d(56, 56, 3, padding=1, groups=56)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        x = self.down(torch.relu(self.conv(x)))
        return torch.relu(self.depthwise(x) + x)


@pytest.fixture(scope="module")
def odd_convs(tmp_path_factory):
    """The model and its fp16 CUDA build with the wgmma kernel off (rule ``wgmma_gemm``): the
    3x3 conv's 1058 rows and K = 216 would be the wgmma kernel's (``test_cuda_wgmma.py``)."""
    rules = tmp_path_factory.mktemp("rules") / "wgmma-off.toml"
    rules.write_text("[default]\nwgmma_gemm = { enabled = false }\n")
    torch.manual_seed(0)
    net = OddConvs().eval()
    with torch.no_grad():  # a BatchNorm that does something
        net.bn.running_mean.uniform_(-0.5, 0.5)
        net.bn.running_var.uniform_(0.5, 2.0)
    model = api.import_torch(net, [torch.randn(2, 3, 45, 45)])
    return model, api.compile_model(model, CUDA, api.BuildOptions(
        use_database=False, dtype="float16", fusion_rules=rules))


def test_dense_convs_take_the_mma_schedule_and_depthwise_does_not(odd_convs):
    _, compiled = odd_convs
    analysis = compiled.analysis
    convs = {k: analysis.implementations.get(k) for k in analysis.kernels if "conv2d" in k}
    assert len(convs) == 4, convs
    dense = {k: v for k, v in convs.items() if v == NAME}
    assert len(dense) == 3, convs  # stem, 3x3, strided 1x1
    # the stem's 3 channels rearranged space-to-depth: a 4x4 conv over 16 (rule
    # space_to_depth_conv; tests/passes/test_space_to_depth_conv.py)
    assert sum(k.startswith(INPUT_TRANSFORM) for k in analysis.kernels) == 1
    # the epilogues stay in the conv's kernel: no add or ReLU launched on its own
    assert not [k for k in analysis.kernels if "conv2d" not in k and ("relu" in k or "add" in k)]


def test_the_conv_source_holds_mma_ldmatrix_and_cp_async_and_nvcc_compiles_it(odd_convs,
                                                                              tmp_path):
    _, compiled = odd_convs
    source = cuda_source(compiled.executable)
    assert source.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") >= 3
    assert "ldmatrix.sync.aligned" in source and "cp.async" in source
    nvcc_compiles(source, tmp_path)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (run on the GPU host)")
def test_numbers_against_pytorch_float32(odd_convs, tmp_path):
    model, compiled = odd_convs
    (out,) = api.load(api.build(compiled, tmp_path / "convs")).run(model.example_inputs)
    (reference,) = model.reference(*model.example_inputs)
    assert np.linalg.norm(out - reference) / np.linalg.norm(reference) < 1e-2
