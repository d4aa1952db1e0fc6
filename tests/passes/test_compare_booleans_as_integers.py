"""CompareBooleansAsIntegers (``tvmfuse/passes/compare_booleans_as_integers.py``): comparisons of
boolean tensors compare them as int8; LongT5's ``mask > 0`` over a bool mask did not compile, and
LongCat-Flash's ``(x < 0) == True`` failed LLVM's verifier (TVM's LLVM code generator takes
booleans for neither integers nor floats)."""

from __future__ import annotations

import torch
from torch import nn

from tvmfuse import api

from conftest import HOST


class _Ordered(nn.Module):
    def forward(self, x, y):
        a, b = x > 0, y > 0
        return (a > b, a >= b, a < b, a <= b, a > 0, (a < 1).float() * x, a == b,
                a != b, (x < 0) == True)  # noqa: E712 - the comparison itself is tested


def test_comparisons_of_booleans_compile_and_match_pytorch(tmp_path):
    model = api.import_torch(_Ordered(), (torch.randn(4, 8), torch.randn(4, 8)))
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions())
    deployed = api.load(api.build(compiled, tmp_path / "out"))
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    for got, want in zip(deployed.run([x.numpy(), y.numpy()]), _Ordered()(x, y)):
        assert (got == want.numpy()).all()
