"""The zoo's suite (tvmfuse/zoo/suite.py): real `transformers` architectures, none of them
fitted for, imported as a user brings them (transformers' default attention), built, verified
against PyTorch on inputs that exercise them, each attention layer one kernel. Small configs
(``tiny-<name>``) here; the full sizes are the slow tests and BENCHMARKS.md's table."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from tvmfuse import api
from tvmfuse.bench.session import bench
from tvmfuse.compiler import cuda_source
from tvmfuse.verify import TOLERANCE, verify
from tvmfuse.zoo import SUITE

from conftest import HOST
from cuda_alignment import misaligned
from cuda_collectives import conditional_shuffles

TARGET = api.get_target(HOST)
#: Architectures without attention layers.
CONVNETS = {"regnet", "efficientnet", "convnext"}
GPU = tvm.cuda(0).exist


def _check(source: str, tmp_path):
    model = api.import_model(source)
    for ref in model.reference(*model.example_inputs):
        assert np.std(ref) > 0, f"{source}: a constant output cannot tell a wrong build"
    ids = [a for s, a in zip(model.inputs, model.example_inputs) if s.name == "input_ids"]
    if ids:  # token ids drawn across the vocabulary, not in (0, 2)
        assert ids[0].max() > 100
    compiled = api.compile_model(model, TARGET, api.BuildOptions(use_database=False))
    checks = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert max(c.rel_err for c in checks) < 1e-4
    return compiled


@pytest.mark.parametrize("name", list(SUITE))
def test_small_config_builds_verifies_and_fuses_attention(name, tmp_path):
    compiled = _check(f"tiny-{name}", tmp_path)
    rules = {g.rule for g in compiled.analysis.groups}
    if name not in CONVNETS:
        assert "tvmfuse.fused_attention" in rules, f"{name}: attention not fused"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_llama_in_half_precision_fuses_attention_and_beats_pytorch(dtype, tmp_path):
    """Llama's Q and K leave the rotary embedding in float32 (ToMixedPrecision keeps the
    products with float32 cos and sin there, casting them only for the matmul), its V in the
    narrow type: each attention layer is still one kernel (it was 6 kernels a layer, and
    PyTorch's error beat ours on the H200), and no less accurate than PyTorch in that
    precision."""
    model = api.import_model("tiny-llama-prefill")
    compiled = api.compile_model(model, TARGET, api.BuildOptions(use_database=False,
                                                                 dtype=dtype))
    attention = [g for g in compiled.analysis.groups if g.rule == "tvmfuse.fused_attention"]
    assert len(attention) == model.torch_module.model.config.num_hidden_layers
    for check in verify(api.load(api.build(compiled, tmp_path / "out")), model):
        assert check.rel_err <= min(TOLERANCE[dtype], check.peer_err), check


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SUITE))
def test_full_size_builds_and_verifies(name, tmp_path):
    _check(name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SUITE))
def test_small_config_in_bf16_on_this_cpu_as_accurate_as_pytorch(name, tmp_path):
    """Each architecture in bf16 on this CPU (on AVX-512 BF16, its GEMMs and convs on
    vdpbf16ps) within bf16's tolerance of PyTorch fp32, or of PyTorch's own bf16 error where
    that is larger (EfficientNet's: 4.4e-2)."""
    model = api.import_model(f"tiny-{name}")
    compiled = api.compile_model(model, TARGET, api.BuildOptions(use_database=False,
                                                                 dtype="bfloat16"))
    for check in verify(api.load(api.build(compiled, tmp_path / "out")), model):
        assert check.rel_err < max(TOLERANCE["bfloat16"], check.peer_err), check


@pytest.mark.slow
@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=(
        "int8 is 1.1e-1 off float32 (top-1 agreement 78% in `tvmfuse bench tiny-efficientnet "
        "--dtype int8`; ONNX Runtime's int8 0%): its squeeze-excited convs need a wider "
        "precision than one uint8 scale per tensor"))) if name == "efficientnet" else name
    for name in SUITE])
def test_small_config_in_int8_on_this_cpu_within_int8_tolerance(name, tmp_path):
    """Each architecture in int8 on this CPU (its GEMMs and convs on vpdpbusd where the CPU has
    AVX-512 VNNI) within int8's tolerance of PyTorch fp32 (1e-1; transformers land at 1e-3 to
    2e-2)."""
    model = api.import_model(f"tiny-{name}")
    compiled = api.compile_model(model, TARGET, api.BuildOptions(use_database=False,
                                                                 dtype="int8"))
    for check in verify(api.load(api.build(compiled, tmp_path / "out")), model):
        assert check.rel_err < TOLERANCE["int8"], check


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (run on the GPU host)")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(SUITE))
def test_small_config_on_cuda_as_accurate_as_pytorch(name, dtype):
    """Each architecture built for the H200 in half precision (tensor-core GEMMs, the attention
    kernel, the fused epilogues) runs within its precision's tolerance of PyTorch fp32 (1e-2 for
    fp16, 2e-2 for bf16; or PyTorch's own error in that precision where it is larger: a deep
    convnet in bf16) and no less accurate than PyTorch eager in the same precision on the same
    GPU and inputs (within 10%: two roundings of the same sums differ by chance)."""
    model = api.import_model(f"tiny-{name}")
    report = bench(model, api.get_target("cuda-sm90"), ["tvmfuse", "torch-eager"],
                   options=api.BuildOptions(use_database=False, dtype=dtype), threads=1,
                   repeat=2, max_seconds=2, peak=False, dtype=dtype)
    assert not report.skipped, report.skipped
    err = {r.engine: r.rel_err for r in report.results}
    assert err["tvmfuse"] < max(TOLERANCE[dtype], err["torch-eager"]), err
    assert err["tvmfuse"] <= 1.1 * err["torch-eager"], err


def segformer_b0():
    """A SegFormer-B0-like encoder (transformers ``SegformerModel``): stages of 32, 64, 160 and
    256 channels (1, 2, 5 and 8 heads of 32), spatial-reduction attention (keys and values from
    a conv of stride 8, 4, 2: 7 x 7 = 49 keys in every stage), Mix-FFN depthwise convs; one
    block a stage, 224 px. The shapes that faulted on the H100 with a misaligned address."""
    import torch  # noqa: PLC0415
    import transformers as tf  # noqa: PLC0415

    from tvmfuse.zoo.suite import Field  # noqa: PLC0415

    torch.manual_seed(0)
    config = tf.SegformerConfig(depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 160, 256])
    return (Field(tf.SegformerModel(config).eval(), "last_hidden_state"),
            (torch.randn(1, 3, 224, 224),))


SEGFORMER = f"{__file__}:segformer_b0"


def test_segformer_cuda_kernels_access_vectors_aligned():
    """Compiled for the H100 (here, no GPU needed): every vector load and store of the CUDA
    source is at an index the shapes keep a multiple of its width, and every warp shuffle is
    made by all the lanes (one under a condition hung SegFormer's attention)."""
    model = api.import_model(SEGFORMER)
    compiled = api.compile_model(model, api.get_target("cuda-sm90"),
                                 api.BuildOptions(use_database=False, dtype="float16"))
    source = cuda_source(compiled.executable)
    assert misaligned(source) == []
    assert conditional_shuffles(source) == []


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (run on the GPU host)")
def test_segformer_on_cuda_runs_and_verifies():
    model = api.import_model(SEGFORMER)
    report = bench(model, api.get_target("cuda-sm90"), ["tvmfuse", "torch-eager"],
                   options=api.BuildOptions(use_database=False, dtype="float16"), threads=1,
                   repeat=2, max_seconds=2, peak=False, dtype="float16")
    assert not report.skipped, report.skipped
    err = {r.engine: r.rel_err for r in report.results}
    assert err["tvmfuse"] < max(TOLERANCE["float16"], err["torch-eager"]), err
