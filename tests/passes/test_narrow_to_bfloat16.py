"""NarrowToBFloat16: ToMixedPrecision's float16 renamed bfloat16 (casts, out_dtypes, constants),
the float32 parts left alone, and a bf16 build of a transformer against PyTorch."""

import ml_dtypes
import numpy as np
import tvm
from tvm import relax

from tvmfuse import api
from tvmfuse.passes import NarrowToBFloat16

from conftest import HOST, relax_main

WEIGHT = np.arange(32, dtype="float32").reshape(8, 4) / 7


def _linear(narrow: str):
    """x (float32) cast to ``narrow``, times a ``narrow`` constant summed into ``narrow``, then
    a LayerNorm-like float32 tail: what ToMixedPrecision writes for a linear layer."""
    def body(bb, x):
        h = bb.emit(relax.op.astype(x, narrow))
        weight = WEIGHT.astype("float16")  # the constant as ToMixedPrecision left it
        if narrow == "bfloat16":
            weight = weight.astype("float32").astype(ml_dtypes.bfloat16)
        y = bb.emit(relax.op.matmul(h, relax.const(weight, narrow), out_dtype=narrow))
        return relax.op.astype(y, "float32")

    return relax_main({"x": (2, 8)}, body)


def test_float16_becomes_bfloat16_everywhere():
    after = NarrowToBFloat16()(_linear("float16"))
    tvm.ir.assert_structural_equal(after, _linear("bfloat16"))


def test_a_float32_module_is_unchanged():
    before = relax_main({"x": (2, 8)}, lambda bb, x: relax.op.matmul(
        x, relax.const(WEIGHT), out_dtype="float32"))
    tvm.ir.assert_structural_equal(NarrowToBFloat16()(before), before)


def test_bf16_transformer_verifies_against_pytorch(tmp_path):
    """tiny-transformer on this CPU: bf16 (8 significant bits) is less exact than fp16 (11) and
    within bf16's tolerance, 2e-2; its kernels compute in bfloat16, not float16 or float32."""
    model = api.import_model("tiny-transformer")
    (reference,) = model.reference(*model.example_inputs)
    errors = {}
    for dtype in ("float16", "bfloat16"):
        compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions(
            use_database=False, dtype=dtype))
        (out,) = api.load(api.build(compiled, tmp_path / dtype)).run(model.example_inputs)
        errors[dtype] = np.linalg.norm(out - reference) / np.linalg.norm(reference)
    assert errors["float16"] < errors["bfloat16"] < 2e-2, errors
    mod, _ = api.analyze(model, api.get_target(HOST), api.BuildOptions(dtype="bfloat16"))
    dtypes = {str(p.dtype) for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)
              for p in f.params}
    assert "bfloat16" in dtypes and "float16" not in dtypes


def _norm_after_narrow(narrow: str, widened: bool):
    """A LayerNorm over a ``narrow`` tensor (ToMixedPrecision lets a norm follow a float16
    input: ViT's first, after the patch embedding's add); ``widened``: computed in float32."""
    gamma = np.ones(8, "float16") if narrow == "float16" else np.ones(8, ml_dtypes.bfloat16)

    def body(bb, x):
        h = bb.emit(relax.op.astype(x, narrow))
        g = relax.const(gamma, narrow)
        if not widened:
            return relax.op.nn.layer_norm(h, g, g, axes=[-1])
        wide = [bb.emit(relax.op.astype(v, "float32")) for v in (h, g, g)]
        norm = bb.emit(relax.op.nn.layer_norm(*wide, axes=[-1]))
        return relax.op.astype(norm, narrow)

    return relax_main({"x": (2, 8)}, body)


def test_a_narrow_norm_is_computed_in_float32():
    """topi's layer_norm takes no bfloat16, and FoldConstant legalizes every call: ViT's bf16
    build failed in its first phase on that LayerNorm."""
    after = NarrowToBFloat16()(_norm_after_narrow("float16", widened=False))
    tvm.ir.assert_structural_equal(after, _norm_after_narrow("bfloat16", widened=True))
    relax.transform.FoldConstant()(after)  # legalizable: float32
