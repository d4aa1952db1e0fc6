"""The operator strategy: every kernel of a model gets a recorded implementation, with
database records first, hand-written schedules next, defaults last."""

import pytest

from tvmfuse import api, strategy

from conftest import HOST


@pytest.mark.parametrize("model", ["tiny-resnet", "tiny-mobilenet", "tiny-transformer"])
def test_every_kernel_has_a_hand_written_schedule_on_this_cpu(build_tiny, model):
    _, folder = build_tiny(model, use_database=False)
    implementations = api.load(folder).manifest["implementations"]
    assert implementations, "the manifest names each kernel's implementation"
    assert strategy.DEFAULT not in implementations.values()
    assert all(impl.startswith("cpu.") for impl in implementations.values())


def test_convs_are_nhwc_with_hwio_weights_on_cpus_and_ohwi_on_gpus():
    model = api.import_model("tiny-resnet")
    options = api.BuildOptions(use_database=False)
    cpu_mod, _ = api.analyze(model, api.get_target(HOST), options, until="fold")
    gpu_mod, _ = api.analyze(model, api.get_target("cuda-sm90"), options, until="fold")
    assert 'data_layout="NHWC", kernel_layout="HWIO"' in cpu_mod.script(show_meta=False)
    gpu = gpu_mod.script(show_meta=False)
    assert 'data_layout="NHWC", kernel_layout="OHWI"' in gpu and 'data_layout="NCHW"' not in gpu


@pytest.mark.parametrize("target", [HOST, "cuda-sm90"])
def test_relu6_keeps_the_nhwc_layout_on_every_family(target):
    """ConvertLayout has no rule for clip: without DecomposeClip first, each ReLU6 of a CUDA
    build ran as a transpose back to NCHW and the clip (MobileNetV2 fp32: 94 kernels, 59 now)."""
    _, analysis = api.analyze(api.import_model("tiny-mobilenet"), api.get_target(target),
                              api.BuildOptions(use_database=False), until="fuse_tir")
    assert not [k for k in analysis.kernels if "transpose" in k or "clip" in k], analysis.kernels


def test_cuda_kernels_get_dlight_rules():
    model = api.import_model("tiny-transformer")
    mod, analysis = api.analyze(model, api.get_target("cuda-sm90"),
                                api.BuildOptions(use_database=False), until="schedule")
    # and the fused attention, a kernel written scheduled (schedules/cuda/attention.py)
    assert set(analysis.implementations.values()) <= {
        "dlight.Matmul", "dlight.GEMV", "dlight.Reduction", "dlight.GeneralReduction",
        "dlight.Fallback", "cuda.attention"}
    assert "cuda.attention" in analysis.implementations.values()
    assert "dlight.Matmul" in analysis.implementations.values()


def test_the_layout_rule_can_be_switched_off(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(f"[{HOST}]\nconv_layout_nhwc = {{ enabled = false }}\n")
    model = api.import_model("tiny-resnet")
    mod, analysis = api.analyze(model, api.get_target(HOST),
                                api.BuildOptions(fusion_rules=rules, use_database=False),
                                until="schedule")
    assert "NHWC" not in mod.script(show_meta=False)
    # NCHW convs have no contiguous output-channel axis: the catch-all takes them
    conv_kernels = [k for k in analysis.implementations if "conv2d" in k]
    assert conv_kernels and all(analysis.implementations[k] != "cpu.conv2d" for k in conv_kernels)


def _linear_gelu():
    """BERT's FFN up-projection: a GEMM with bias and GELU (torch's exact, erf form)."""
    import torch

    class LinearGelu(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(64, 256)

        def forward(self, x):
            return torch.nn.functional.gelu(self.linear(x))

    return LinearGelu().eval()


def _erf_calls(mod) -> int:
    """Calls of ``erf`` left in the TIR of ``mod`` (what LLVM turns into one libm call a lane)."""
    import tvm

    return sum(func.script().count("T.erf(") for func in mod.functions.values()
               if isinstance(func, tvm.tirx.PrimFunc))


def test_gelu_erf_is_a_polynomial_on_cpus_and_matches_pytorch(tmp_path):
    import torch

    from tvmfuse.verify import verify

    model = api.import_torch(_linear_gelu(), [torch.randn(2, 16, 64)])
    target = api.get_target(HOST)
    fast, _ = api.analyze(model, target, api.BuildOptions(), until="fuse_tir")
    assert _erf_calls(fast) == 0
    off = tmp_path / "off.toml"
    off.write_text("[default]\nfast_erf = { enabled = false }\n")
    libm, _ = api.analyze(model, target, api.BuildOptions(fusion_rules=off), until="fuse_tir")
    assert _erf_calls(libm) == 1
    gpu, _ = api.analyze(model, api.get_target("cuda-sm90"), api.BuildOptions(), until="fuse_tir")
    assert _erf_calls(gpu) == 1  # CUDA keeps its own erff
    compiled = api.compile_model(model, target, api.BuildOptions())
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-6


def _exp_calls(mod) -> int:
    import tvm

    return sum(func.script().count("T.exp(") + func.script().count("T.tanh(")
               + func.script().count("T.sigmoid(")
               for func in mod.functions.values() if isinstance(func, tvm.tirx.PrimFunc))


def test_sigmoid_is_a_polynomial_on_cpus_and_matches_pytorch(tmp_path):
    """SiLU (x * sigmoid(x) once exported: EfficientNet's epilogues); tanh stays TVM's."""
    import torch

    from tvmfuse.verify import verify

    class ConvSiluTanh(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 32, 1)

        def forward(self, x):
            return torch.tanh(torch.nn.functional.silu(self.conv(x)))

    torch.manual_seed(0)
    model = api.import_torch(ConvSiluTanh().eval(), [torch.randn(1, 8, 12, 12) * 4])
    target = api.get_target(HOST)
    fast, _ = api.analyze(model, target, api.BuildOptions(), until="fuse_tir")
    assert _exp_calls(fast) == 1  # the tanh
    off = tmp_path / "off.toml"
    off.write_text("[default]\nfast_exp = { enabled = false }\n")
    libm, _ = api.analyze(model, target, api.BuildOptions(fusion_rules=off), until="fuse_tir")
    assert _exp_calls(libm) == 2
    compiled = api.compile_model(model, target, api.BuildOptions())
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-6


@pytest.mark.parametrize("enabled", [True, False])
def test_cuda_builds_replay_their_kernels_as_cuda_graphs(enabled, tmp_path):
    """``cuda_graph``: the kernels between statically planned allocations are captured as one
    CUDA graph on the first call and replayed (the VM code calls TVM's capture builtin); off, the
    VM launches each kernel itself."""
    rules = tmp_path / "rules.toml"
    rules.write_text(f"[cuda]\ncuda_graph = {{ enabled = {str(enabled).lower()} }}\n")
    compiled = api.compile_model(api.import_model("tiny-resnet"), api.get_target("cuda-sm90"),
                                 api.BuildOptions(use_database=False, fusion_rules=rules))
    vm_code = compiled.executable.as_text()
    assert ("vm.builtin.cuda_graph.run_or_capture" in vm_code) == enabled
