"""What tvmfuse's fusion makes of the zoo models: kernel counts and bytes moved against the
unfused pipeline and TVM's stock FuseOps (analysis only: no code is generated here)."""

import collections

import pytest
import torch
from torch import nn

from tvmfuse import api

TARGET = api.get_target("avx512")


@pytest.fixture(scope="module")
def benefit(tmp_path_factory):
    cache = {}
    direct = tmp_path_factory.mktemp("rules") / "direct.toml"
    direct.write_text("[avx512]\nwinograd_conv2d = { enabled = false }\n")

    def get(name, winograd=True):
        if (name, winograd) not in cache:
            options = api.BuildOptions(fusion_rules=None if winograd else direct)
            cache[name, winograd] = api.benefit(api.import_model(name), TARGET, options)
        return cache[name, winograd]

    return get


def _ops(report):
    return collections.Counter(op for g in report["groups"] for op in g["ops"])


def test_resnet50_has_no_standalone_batch_norm_relu_add_or_layout_kernel(benefit):
    report = benefit("resnet50", winograd=False)  # every conv direct: see the next test
    tvmfuse, stock = report["pipelines"]["tvmfuse"], report["pipelines"]["stock"]
    # 53 convs, the 4 downsample convs merged into their block's last conv; pool, mean, linear
    assert tvmfuse["kernels"] <= 52 < stock["kernels"]
    ops = _ops(report)
    assert ops["conv2d"] == 49
    # each downsample conv reads its (subsampled) input through its block's last conv
    assert ops["concatenate"] == 4 and ops["strided_slice"] == 3
    # the input's NHWC transpose is the stem conv's prologue; none stands alone
    assert ops["transpose"] == 1
    # Every ReLU (49) and every residual add (12 left; 4 became the merged convs' K axis) sits in a
    # conv kernel; BatchNorm is folded (its bias adds are the only other adds).
    assert ops["relu"] == 49 and ops["add"] == 49 + 12 + 1
    assert not {"subtract", "divide", "multiply"} & set(ops)
    assert tvmfuse["bytes"] <= 0.30 * report["pipelines"]["unfused"]["bytes"]


def test_resnet50_winograd_convs_keep_their_epilogues(benefit):
    """By default (avx512) the 11 stride-1 3x3 convs on 56x56 to 14x14 become Winograd's input
    transform, batched matmul and output transform; their bias and ReLU are fused into the
    output transform. The 7x7 stage's (16 tiles) stay direct."""
    report = benefit("resnet50")
    tvmfuse, stock = report["pipelines"]["tvmfuse"], report["pipelines"]["stock"]
    assert tvmfuse["kernels"] == 52 + 2 * 11 < stock["kernels"]
    ops = _ops(report)
    assert ops["conv2d"] == 49 - 11 and ops["winograd_output_transform"] == 11
    transforms = [g["ops"] for g in report["groups"] if "winograd_output_transform" in g["ops"]]
    assert transforms == [["winograd_output_transform", "add", "relu"]] * 11
    assert ops["relu"] == 49 and ops["add"] == 49 + 12 + 1
    # V and M (4x the conv's input and output) cost the bytes that direct convs save
    assert tvmfuse["bytes"] < stock["bytes"]


def test_mobilenet_v2_folds_every_batch_norm_and_relu6_into_its_conv(benefit):
    report = benefit("mobilenet_v2")
    conv_groups = [g for g in report["groups"] if g["rule"].startswith("tvmfuse.conv_epilogue")]
    assert len(conv_groups) == 52  # every conv
    # every ReLU6, as DecomposeClip leaves it for the NHWC layout
    assert sum(g["ops"][-2:] == ["maximum", "minimum"] for g in conv_groups) == 35
    assert not {"subtract", "divide", "multiply"} & set(_ops(report))
    assert report["pipelines"]["tvmfuse"]["kernels"] < report["pipelines"]["stock"]["kernels"]


def test_bert_base_fuses_qkv_epilogues_and_attention(benefit):
    report = benefit("bert-base")
    rules = collections.Counter(g["rule"] for g in report["groups"])
    assert rules["tvmfuse.matmul_epilogue.bias_gelu"] == 12
    # attention out and FFN down: GEMM + bias + residual + LayerNorm
    assert rules["tvmfuse.layer_norm_epilogue.bias_add"] == 24
    assert not rules["tvmfuse.matmul_epilogue.bias_add"]
    # each layer's attention, head split to head merge, is one kernel reading the packed QKV
    assert rules["tvmfuse.fused_attention"] == 12
    assert not any(g["rule"].startswith("tvmfuse.scale_mask_softmax") for g in report["groups"])
    # Q, K and V: one GEMM per layer
    assert rules["tvmfuse.matmul_epilogue.bias"] == 12
    tvmfuse, stock = report["pipelines"]["tvmfuse"], report["pipelines"]["stock"]
    # per layer: QKV GEMM, attention, out GEMM + residual + LayerNorm, FFN up + GELU, FFN down
    # + residual + LayerNorm (60); the embedding lookup, its add + LayerNorm, the mask (gathers
    # fused: MarkGathersInjective), the pooler's GEMM + bias + tanh reading the first token
    assert tvmfuse["kernels"] <= 64 < stock["kernels"]
    (pooler,) = [g for g in report["groups"] if g["rule"] == "tvmfuse.matmul_epilogue.bias_tanh"]
    assert pooler["ops"] == ["take", "matmul", "add", "tir_tanh"]
    assert tvmfuse["bytes"] <= 0.5 * report["pipelines"]["unfused"]["bytes"]


class ConvBNReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(64, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_resnet_conv3x3_bn_relu_block_moves_at_most_38_percent_of_unfused_bytes(tmp_path):
    model = api.import_torch(ConvBNReLU().eval(), [torch.randn(1, 64, 56, 56)])
    # The block alone, in the layout it came in: in NHWC a one-block model also moves its input
    # and output through a transpose each, which a whole network pays once.
    rules = tmp_path / "nchw.toml"
    rules.write_text("[avx512]\nconv_layout_nhwc = { enabled = false }\n")
    pipelines = api.benefit(model, TARGET, api.BuildOptions(fusion_rules=rules))["pipelines"]
    assert pipelines["tvmfuse"]["kernels"] == 1
    assert pipelines["tvmfuse"]["bytes"] <= 0.38 * pipelines["unfused"]["bytes"]
