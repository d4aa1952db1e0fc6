import pytest
import torch
import tvm
from tvm import relax

from tvmfuse import api
from tvmfuse.compiler import cuda_sources
from tvmfuse.passes import ExpandIntegerPower
from tvmfuse.verify import verify

from conftest import HOST, relax_main


def _power(exponent, shape=()):
    return lambda bb, x: relax.op.power(x, relax.const(torch.full(shape, exponent).numpy()))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_whole_powers_become_products(n):
    def products(bb, x):
        if n == 2:
            return relax.op.multiply(x, x)
        square = bb.emit(relax.op.multiply(x, x))
        return relax.op.multiply(square, x if n == 3 else square)

    before = relax_main({"x": (4, 8)}, _power(float(n)))
    if n == 1:  # x ** 1 is x itself: main returns its parameter
        after = ExpandIntegerPower()(before)
        assert after["main"].body.body.same_as(after["main"].params[0])
        return
    tvm.ir.assert_structural_equal(ExpandIntegerPower()(before),
                                   relax_main({"x": (4, 8)}, products))


@pytest.mark.parametrize("exponent,shape", [(2.5, ()), (5.0, ()), (-2.0, ()), (2.0, (3, 4, 8))])
def test_other_powers_are_left(exponent, shape):
    """Fractional, large and negative exponents, and an exponent that broadcasts x."""
    before = relax_main({"x": (4, 8)}, _power(exponent, shape))
    tvm.ir.assert_structural_equal(ExpandIntegerPower()(before), before)


class RMSNorm(torch.nn.Module):
    """Llama's and T5's: the mean of squares in float32."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(64) + 0.5)

    def forward(self, x):
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + 1e-6))


def _rms_model():
    torch.manual_seed(0)
    return api.import_torch(RMSNorm().eval(), [torch.randn(1, 13, 64)])


def test_rms_norm_over_negative_values_matches_pytorch(tmp_path):
    model = _rms_model()
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    assert not any("power" in k for k in compiled.analysis.kernels), compiled.analysis.kernels
    (check,) = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert check.rel_err < 1e-6


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_rms_norm_has_no_fast_math_powf(dtype):
    """TVM's nvcc flags include --use_fast_math: powf(x, 2) was NaN for x < 0 on the H200."""
    compiled = api.compile_model(_rms_model(), api.get_target("cuda-sm90"),
                                 api.BuildOptions(dtype=dtype))
    source = "\n".join(cuda_sources(compiled.executable))
    assert "__global__" in source and "powf" not in source
