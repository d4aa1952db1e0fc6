"""ConvNeXt's 7x7-stage GEMMs (a Linear layer over a ``[1, 7, 7, C]`` NHWC map: 49 merged rows)
built with the register tile tvmfuse chooses, or with one forced, each kernel timed alone
(``tvmfuse.profile``, the fastest of 7 profiles), untuned:

    .venv/bin/python benchmarks/merged_rows_tiles.py [--tiles auto,7x3,7x2] [--hw 7]

A tile is ``ROWSxBLOCKS`` (blocks of one vector: 16 lanes on AVX-512), forced for GEMMs of
``hw * hw`` rows only, unpadded: its blocks must divide the columns' vectors. Session 24 (Zen 4): 49 x 768 x 3072 + GELU 128 GFLOP/s in the predicated
tiles chosen before, 233 in 7 x 3.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TVM_BIND_THREADS", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from tvmfuse import api, compiler, profile  # noqa: E402
from tvmfuse.schedules.cpu import _blocked  # noqa: E402
from tvmfuse.targets import get_target  # noqa: E402

SHIPPED = _blocked.choose_tile, _blocked.dividing_tile


def force(spec: str, rows: int) -> None:
    """Make the tile choosers give ``spec`` (``auto``: their own choice) for ``rows`` rows."""
    _blocked.choose_tile, _blocked.dividing_tile = SHIPPED
    if spec == "auto":
        return
    tile_rows, blocks = map(int, spec.split("x"))

    def forcing(chooser):
        def forced(rows_extent, cols_extent, vector, **kwargs):
            if rows_extent == rows:
                return _blocked.Tile(tile_rows, blocks, vector.lanes)
            return chooser(rows_extent, cols_extent, vector, **kwargs)
        return forced

    _blocked.choose_tile, _blocked.dividing_tile = map(forcing, SHIPPED)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", default="auto,7x3,7x2")
    parser.add_argument("--hw", type=int, default=7)
    args = parser.parse_args()
    target = get_target("avx512")
    for spec in args.tiles.split(","):
        force(spec, args.hw * args.hw)
        for cin, cout, gelu in ((768, 3072, True), (3072, 768, False)):
            torch.manual_seed(0)
            module = nn.Sequential(nn.Linear(cin, cout), *([nn.GELU()] if gelu else [])).eval()
            model = api.import_torch(module, [torch.randn(1, args.hw, args.hw, cin)],
                                     name=f"linear {cin} -> {cout}")
            compiled = compiler.compile_model(model, target,
                                              compiler.BuildOptions(use_database=False))
            info = compiled.analysis
            best = {}
            for _ in range(7):
                for t in profile.profile(compiled.executable, target.device_here(), info.kernels,
                                         info.implementations, info.kernel_info):
                    if t.flops and (t.name not in best or t.ms < best[t.name].ms):
                        best[t.name] = t
            for t in best.values():
                print(f"{spec:5s} {args.hw * args.hw} x {cin} x {cout}{' + GELU' if gelu else ''}: "
                      f"{t.ms * 1e3:7.1f} us {t.gflops:6.1f} GFLOP/s ({t.implementation})",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
