"""fp16 builds sum their matmuls and convs in float32 (``tvmfuse/strategy/accumulate.py``): the
reduction of each such kernel writes a float32 buffer, the epilogue stays in the same kernel,
and the outputs are closer to float32 PyTorch than with float16 sums (``accumulator=None``)."""

from __future__ import annotations

import numpy as np
import torch
from tvm import s_tir, tirx

from tvmfuse import api

from conftest import HOST


class ConvThenLinear(torch.nn.Module):
    """A conv with its bias and ReLU, then a linear layer with its bias and GELU: one epilogue of
    each kind the fusion patterns take."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.linear = torch.nn.Linear(16 * 6 * 6, 96)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(torch.relu(self.conv(x)).flatten(1)))


def _reduction_dtypes(mod) -> dict[str, str]:
    """Kernel name -> dtype of the buffer its (one) sum-reduction block writes."""
    found = {}
    for gvar, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        sch = s_tir.Schedule(func)
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            stmt = sch.get(block)
            if stmt.init is not None and any(
                    iv.iter_type != tirx.IterVar.DataPar for iv in stmt.iter_vars):
                found[gvar.name_hint] = str(stmt.writes[0].source.dtype)
    return found


def test_fp16_convs_and_matmuls_sum_in_float32_inside_their_kernel():
    torch.manual_seed(0)
    model = api.import_torch(ConvThenLinear().eval(), [torch.randn(1, 8, 6, 6)])
    built = {}
    for accumulator in ("float32", None):
        options = api.BuildOptions(use_database=False, dtype="float16", accumulator=accumulator)
        built[accumulator] = api.analyze(model, api.get_target(HOST), options, until="fuse_tir")
    (wide, wide_analysis), (narrow, narrow_analysis) = built["float32"], built[None]
    # the conv+bias+ReLU and matmul+bias+GELU groups are each one kernel either way (the
    # widened bias's cast numbers the standalone casts' names differently)
    assert len(wide_analysis.kernels) == len(narrow_analysis.kernels)
    assert [k for k in wide_analysis.kernels if k.startswith("fused")] == [
        k for k in narrow_analysis.kernels if k.startswith("fused")]
    assert "fused_relax_matmul_relax_add_relax_nn_gelu" in wide_analysis.kernels
    sums = _reduction_dtypes(wide)
    convs = [k for k in sums if "conv2d" in k]
    matmuls = [k for k in sums if "matmul" in k]
    assert convs and matmuls
    assert {sums[k] for k in convs + matmuls} == {"float32"}
    assert {_reduction_dtypes(narrow)[k] for k in convs + matmuls} == {"float16"}


def test_float32_sums_make_a_fp16_transformer_closer_to_pytorch(tmp_path):
    """tiny-transformer in fp16 on this CPU: 5.9e-4 with float16 sums, 1.5e-4 with float32 sums
    (relative L2 error against PyTorch float32; both below the fp16 tolerance of 1e-2)."""
    model = api.import_model("tiny-transformer")
    (reference,) = model.reference(*model.example_inputs)
    errors = {}
    for accumulator in ("float32", None):
        compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions(
            use_database=False, dtype="float16", accumulator=accumulator))
        (out,) = api.load(api.build(compiled, tmp_path / str(accumulator))).run(
            model.example_inputs)
        errors[accumulator] = np.linalg.norm(out - reference) / np.linalg.norm(reference)
    assert errors["float32"] < errors[None] / 2 < 1e-2, errors
