"""PrepackWeights (the ``prepack_weights`` rule): the weights a CPU schedule reads in panels are
packed once, at build time, and the kernels keep their names."""

from __future__ import annotations

import numpy as np
import torch
import tvm
from tvm import relax, tirx

from tvmfuse import api
from tvmfuse.names import LAYOUT_REWRITE_PREPROC
from tvmfuse.passes.prepack_weights import PACKED, PACKING

from conftest import HOST

TARGET = api.get_target(HOST)


class Block(torch.nn.Module):
    """A conv and a linear layer: both kinds of weight the register-blocked schedule packs."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.linear = torch.nn.Linear(32 * 8 * 8, 128)

    def forward(self, x):
        return torch.relu(self.linear(torch.relu(self.conv(x)).flatten(1)))


def _model():
    torch.manual_seed(0)
    module = Block().eval()
    x = torch.randn(1, 16, 8, 8)
    return module, x, api.import_torch(module, [x])


def _constant_shapes(mod: tvm.IRModule) -> list[tuple[int, ...]]:
    """Shapes of the tensor constants the kernels are called with."""
    shapes = []

    def visit(expr):
        if isinstance(expr, relax.Call):
            for arg in expr.args:
                for field in getattr(arg, "fields", []):
                    if isinstance(field, tvm.ir.expr.GenericConst):
                        shapes.append(tuple(int(d) for d in field.ty.shape))

    relax.analysis.post_order_visit(mod["main"], visit)
    return shapes


def _kernels(mod: tvm.IRModule) -> set[str]:
    return {g.name_hint for g, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}


def test_weights_are_packed_at_build_time_and_kernels_keep_their_names(tmp_path):
    module, x, model = _model()
    options = api.BuildOptions(use_database=False)
    scheduled, analysis = api.analyze(model, TARGET, options, until="schedule")
    packing = [name for name in _kernels(scheduled)
               if LAYOUT_REWRITE_PREPROC in scheduled[name].script()]
    assert len(packing) == 2  # the conv's kernel and the linear layer's pack their weights

    packed, _ = api.analyze(model, TARGET, options, until="prepack")
    assert _kernels(packed) == _kernels(scheduled) == set(analysis.kernels)
    assert not any(name.endswith((PACKING, PACKED)) for name in _kernels(packed))
    assert not any(LAYOUT_REWRITE_PREPROC in packed[name].script() for name in _kernels(packed))
    # HWIO [3, 3, 16, 32] and [2048, 128] became panels: [32 / p, 3, 3, 16, p], [128 / q, 2048, q]
    # (q need not divide 128: AVX2's one-row tile is 7 vectors, 56 columns, the last panel padded)
    shapes = _constant_shapes(packed)
    assert (3, 3, 16, 32) not in shapes and (2048, 128) not in shapes
    assert any(len(s) == 5 and s[1:4] == (3, 3, 16) and s[0] * s[4] == 32 for s in shapes)
    assert any(len(s) == 3 and s[1] == 2048 and s[0] == -(-128 // s[2]) for s in shapes)

    folder = api.build(api.compile_model(model, TARGET, options), tmp_path / "out")
    (out,) = api.load(folder).run([x.numpy()])
    with torch.no_grad():
        expected = module(x).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_the_rule_turned_off_leaves_the_weights_as_they_are(tmp_path):
    _, _, model = _model()
    off = tmp_path / "rules.toml"
    off.write_text("[default]\nprepack_weights = { enabled = false }\n")
    mod, _ = api.analyze(model, TARGET, api.BuildOptions(use_database=False, fusion_rules=off),
                         until="prepack")
    assert (2048, 128) in _constant_shapes(mod)
    assert not any(LAYOUT_REWRITE_PREPROC in mod[name].script() for name in _kernels(mod))


def test_gpu_kernels_are_not_marked_for_packing():
    _, _, model = _model()
    mod, _ = api.analyze(model, api.get_target("cuda-sm90"), api.BuildOptions(use_database=False),
                         until="fuse_tir")
    assert all(mod[name].attrs.get("layout_free_buffers") is None for name in _kernels(mod))
