"""StoreNarrowed (``tvmfuse/passes/store_narrowed.py``): in a fp16 build, the float32 output of a
LayerNorm that the next GEMM reads narrowed is stored once, in float16; the casts around the
LayerNorm join its kernel, and the build stays within float16's error of PyTorch float32 and no
less exact than PyTorch's own float16 model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tvm import relax
from tvm.script import relax as R

from tvmfuse import api
from tvmfuse.passes import StoreNarrowed

from conftest import HOST


def _rules(tmp_path, enabled: bool):
    path = tmp_path / f"store-narrowed-{enabled}.toml"
    path.write_text(f"[default]\nstore_narrowed = {{ enabled = {str(enabled).lower()} }}\n")
    return path


def _module(leave_norm: bool) -> tvm.IRModule:
    """``n = layer_norm(x + r)`` read by a residual add (float32) and, narrowed, by a matmul;
    ``leave_norm`` also returns ``n``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((4, 8), "float32"))
    r = relax.Var("r", R.Tensor((4, 8), "float32"))
    w = relax.Var("w", R.Tensor((8, 8), "float16"))
    with bb.function("main", [x, r, w]):
        with bb.dataflow():
            s = bb.emit(relax.op.add(x, r))
            n = bb.emit(relax.op.nn.layer_norm(s, relax.const(np.ones(8, "float32")),
                                               relax.const(np.zeros(8, "float32")), axes=[-1]))
            narrow = bb.emit(relax.op.astype(n, "float16"))
            h = bb.emit(relax.op.astype(bb.emit(relax.op.matmul(narrow, w)), "float32"))
            y = bb.emit(relax.op.add(h, n), name_hint="y")
            out = bb.emit_output(relax.Tuple([y, n]) if leave_norm else y)
        bb.emit_func_output(out)
    return bb.get()


def test_the_residual_reads_the_narrowed_copy():
    after = StoreNarrowed()(_module(leave_norm=False))["main"]
    bindings = after.body.blocks[0].bindings
    norm = next(b.var for b in bindings if "layer_norm" in str(b.value.op))
    readers = [b for b in bindings if any(a.same_as(norm) for a in getattr(b.value, "args", []))]
    assert len(readers) == 1 and str(readers[0].value.attrs.dtype) == "float16"
    add = next(b.value for b in bindings if b.var.name == "y")
    assert {str(a.ty.dtype) for a in add.args} == {"float32"}
    widened = next(b.value for b in bindings if b.var.same_as(add.args[1]))
    assert widened.op.name == "relax.astype" and widened.args[0].same_as(readers[0].var)


def test_a_model_output_keeps_its_float32_readers():
    """The norm leaves the function: rounding its other readers would round the output's
    neighbours for nothing (the float32 tensor is stored anyway)."""
    module = _module(leave_norm=True)
    tvm.ir.assert_structural_equal(StoreNarrowed()(module), module)


def test_casts_join_the_layer_norm_kernel(tmp_path):
    """tiny-transformer (one BERT layer) in fp16 for CUDA: the narrowing after the first
    LayerNorm was a kernel of its own (``round_sum``, named after the cast it equals); with the
    pass it is the LayerNorm kernel's output, and the second LayerNorm reads the residual's
    float16 copy. The remaining cast is the model input's."""
    model = api.import_model("tiny-transformer")
    kernels = {}
    for enabled in (True, False):
        options = api.BuildOptions(use_database=False, dtype="float16",
                                   fusion_rules=_rules(tmp_path, enabled))
        kernels[enabled] = api.analyze(model, api.get_target("cuda-sm90"), options,
                                       until="fuse_tir")[1].kernels

    def casts(names):
        return [k for k in names if k.startswith(("cast", "round_sum"))]

    assert len(casts(kernels[False])) == 2 and len(casts(kernels[True])) == 1
    assert len(kernels[True]) == len(kernels[False]) - 1
    norms = [k for k in kernels[True] if "layer_norm" in k]
    assert len(norms) == 2 and norms[0].endswith("layer_norm_relax_astype")
    assert "astype_relax_astype_relax_add" in norms[1]  # both residual operands widened inside


def test_numbers_within_fp16_error_and_no_worse_than_pytorch_fp16(tmp_path):
    model = api.import_model("tiny-transformer")
    (reference,) = model.reference(*model.example_inputs)

    def error(out):
        return float(np.linalg.norm(out - reference) / np.linalg.norm(reference))

    errors = {}
    for enabled in (True, False):
        compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions(
            use_database=False, dtype="float16", fusion_rules=_rules(tmp_path, enabled)))
        with api.load(api.build(compiled, tmp_path / str(enabled))) as deployed:
            (out,) = deployed.run(model.example_inputs)
        errors[enabled] = error(out)
    half = model.torch_module.half()
    with torch.no_grad():
        torch_fp16 = half(*(torch.from_numpy(x).half() for x in model.example_inputs))
    errors["torch fp16"] = error(torch_fp16.float().numpy())
    assert errors[True] < 1e-2 and errors[True] <= errors["torch fp16"], errors
    assert errors[True] == pytest.approx(errors[False], rel=1.0), errors
