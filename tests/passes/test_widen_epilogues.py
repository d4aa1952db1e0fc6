"""WidenEpilogues (``tvmfuse/passes/widen_epilogues.py``): in a fp16/bf16 build's fused groups,
the bias and the activation after a matmul are computed on its float32 sums and rounded once,
before a residual add or at the group's output; float32 groups are left alone; a fp16 build
then rounds where NumPy's one-rounding reference does, and verifies against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm.script import ir as I
from tvm.script import relax as R

from tvmfuse import api
from tvmfuse.passes import WidenEpilogues
from tvmfuse.verify import verify

from conftest import HOST


def test_bias_and_gelu_on_the_float32_sums():
    @I.ir_module
    class Before:
        @R.function(private=True)
        def group(x: R.Tensor((4, 8), "float16"), w: R.Tensor((8, 16), "float16"),
                  b: R.Tensor((16,), "float16")) -> R.Tensor((4, 16), "float16"):
            R.func_attr({"Composite": "tvmfuse.matmul_epilogue.bias_gelu", "Primitive": True})
            with R.dataflow():
                mm = R.matmul(x, w, out_dtype="float16")
                biased = R.add(mm, b)
                gv = R.nn.gelu(biased)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function(private=True)
        def group(x: R.Tensor((4, 8), "float16"), w: R.Tensor((8, 16), "float16"),
                  b: R.Tensor((16,), "float16")) -> R.Tensor((4, 16), "float16"):
            R.func_attr({"Composite": "tvmfuse.matmul_epilogue.bias_gelu", "Primitive": True})
            with R.dataflow():
                mm = R.matmul(x, w, out_dtype="float32")
                wide_b = R.astype(b, "float32")
                biased = R.add(mm, wide_b)
                act = R.nn.gelu(biased)
                gv = R.astype(act, "float16")
                R.output(gv)
            return gv

    tvm.ir.assert_structural_equal(WidenEpilogues()(Before), Expected)


def test_a_residual_add_reads_the_rounded_sum_and_stays_narrow():
    """PyTorch rounds a linear layer's output before the residual add: so does the build."""
    @I.ir_module
    class Before:
        @R.function(private=True)
        def group(x: R.Tensor((4, 8), "bfloat16"), w: R.Tensor((8, 16), "bfloat16"),
                  b: R.Tensor((16,), "bfloat16"), r: R.Tensor((4, 16), "bfloat16")
                  ) -> R.Tensor((4, 16), "bfloat16"):
            R.func_attr({"Composite": "tvmfuse.matmul_epilogue.bias_add", "Primitive": True})
            with R.dataflow():
                mm = R.matmul(x, w, out_dtype="bfloat16")
                biased = R.add(mm, b)
                gv = R.add(biased, r)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function(private=True)
        def group(x: R.Tensor((4, 8), "bfloat16"), w: R.Tensor((8, 16), "bfloat16"),
                  b: R.Tensor((16,), "bfloat16"), r: R.Tensor((4, 16), "bfloat16")
                  ) -> R.Tensor((4, 16), "bfloat16"):
            R.func_attr({"Composite": "tvmfuse.matmul_epilogue.bias_add", "Primitive": True})
            with R.dataflow():
                mm = R.matmul(x, w, out_dtype="float32")
                wide_b = R.astype(b, "float32")
                wide = R.add(mm, wide_b)
                biased = R.astype(wide, "bfloat16")
                gv = R.add(biased, r)
                R.output(gv)
            return gv

    tvm.ir.assert_structural_equal(WidenEpilogues()(Before), Expected)


def test_float32_groups_and_ungrouped_ops_are_left_alone():
    @I.ir_module
    class Module:
        @R.function(private=True)
        def group(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 16), "float32"),
                  b: R.Tensor((16,), "float32")) -> R.Tensor((4, 16), "float32"):
            R.func_attr({"Composite": "tvmfuse.matmul_epilogue.bias", "Primitive": True})
            with R.dataflow():
                mm = R.matmul(x, w, out_dtype="float32")
                gv = R.add(mm, b)
                R.output(gv)
            return gv

        @R.function
        def main(x: R.Tensor((4, 8), "float16"), w: R.Tensor((8, 16), "float16"),
                 b: R.Tensor((16,), "float16")) -> R.Tensor((4, 16), "float16"):
            with R.dataflow():
                mm = R.matmul(x, w, out_dtype="float16")
                gv = R.add(mm, b)
                R.output(gv)
            return gv

    tvm.ir.assert_structural_equal(WidenEpilogues()(Module), Module)


def test_a_scalar_operand_is_not_widened():
    """A 0-d tensor operand (CLIP's quick-GELU factor, lifted into the group) is broadcast
    across a vector: widened, TVM's CUDA codegen printed its float32x8 broadcast as
    make_ulonglong4 of 8 floats. The chain stops before it."""
    @I.ir_module
    class Module:
        @R.function(private=True)
        def group(x: R.Tensor((4, 8), "float16"), w: R.Tensor((8, 16), "float16"),
                  s: R.Tensor((), "float16")) -> R.Tensor((4, 16), "float16"):
            R.func_attr({"Composite": "tvmfuse.matmul_epilogue.scale", "Primitive": True})
            with R.dataflow():
                mm = R.matmul(x, w, out_dtype="float16")
                gv = R.multiply(mm, s)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function(private=True)
        def group(x: R.Tensor((4, 8), "float16"), w: R.Tensor((8, 16), "float16"),
                  s: R.Tensor((), "float16")) -> R.Tensor((4, 16), "float16"):
            R.func_attr({"Composite": "tvmfuse.matmul_epilogue.scale", "Primitive": True})
            with R.dataflow():
                wide = R.matmul(x, w, out_dtype="float32")  # the sums, rounded once
                mm = R.astype(wide, "float16")
                gv = R.multiply(mm, s)
                R.output(gv)
            return gv

    tvm.ir.assert_structural_equal(WidenEpilogues()(Module), Expected)


class LinearGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 96)

    def forward(self, x):
        return nn.functional.gelu(self.up(x))


def test_a_fp16_build_rounds_once_and_verifies_against_pytorch(tmp_path):
    """The build's output is NumPy's ``fp16(gelu(x @ W + b))`` with one rounding (summation
    order apart), not the two-rounding ``fp16(gelu(fp16(fp16(x @ W) + b)))`` it computed
    before; and within fp16's error of PyTorch float32."""
    torch.manual_seed(0)
    module = LinearGelu().eval()
    x = torch.randn(1, 33, 64)
    model = api.import_torch(module, [x])
    lib = api.load(api.build(api.compile_model(model, api.get_target(HOST), api.BuildOptions(
        use_database=False, dtype="float16")), tmp_path / "out"))
    got = lib.run([x.numpy()])[0].astype("float64")

    half = x.numpy().astype("float16").astype("float64")
    w = module.up.weight.detach().numpy().astype("float16").astype("float64").T
    b = module.up.bias.detach().numpy().astype("float16").astype("float64")

    def gelu(v):
        return torch.nn.functional.gelu(torch.from_numpy(v)).numpy()

    def rel(a, ref):
        return np.linalg.norm(a - ref) / np.linalg.norm(ref)

    once = gelu(half @ w + b).astype("float16").astype("float64")
    twice = gelu((((half @ w).astype("float16") + b).astype("float16")).astype("float64")
                 ).astype("float16").astype("float64")
    assert rel(got, once) < rel(got, twice) / 4
    assert max(c.rel_err for c in verify(lib, model)) < 1e-2


class ConvLinearAct(nn.Module):
    """A conv and a linear layer, each with its bias and ``act``, and a residual add."""

    def __init__(self, act: nn.Module):
        super().__init__()
        self.conv, self.act = nn.Conv2d(24, 40, 3, padding=1), act
        self.up, self.down = nn.Linear(40, 72), nn.Linear(72, 40)

    def forward(self, x):
        y = self.act(self.conv(x)).permute(0, 2, 3, 1)
        return self.down(self.act(self.up(y))) + y


@pytest.mark.parametrize("act,dtype", [
    (nn.SiLU(), "float16"), (nn.Sigmoid(), "float16"), (nn.GELU("tanh"), "float16"),
    (nn.GELU(), "float16"), (nn.SiLU(), "bfloat16"), (nn.ReLU6(), "float16"),
])
def test_cuda_kernels_with_each_activation_compile(act, dtype, tmp_path):
    """Widened, sigmoid's and GELU-tanh's constants became float32 vectors of 8 lanes in the
    TVM-scheduled GEMMs and convs, which TVM prints as CUDA that nvcc refuses: those ops stay
    narrow (see ``_ELEMENTWISE``)."""
    from tvmfuse.compiler import cuda_source  # noqa: PLC0415

    from conftest import nvcc_compiles  # noqa: PLC0415

    torch.manual_seed(0)
    model = api.import_torch(ConvLinearAct(act).eval(), [torch.randn(1, 24, 30, 30)])
    compiled = api.compile_model(model, api.get_target("cuda-sm90"), api.BuildOptions(
        use_database=False, dtype=dtype))
    nvcc_compiles(cuda_source(compiled.executable), tmp_path, arch="sm_90a")
