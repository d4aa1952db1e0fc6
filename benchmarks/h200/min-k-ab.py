"""On the GPU host: ResNet-50 fp16 with ``UseWgmmaGemms`` taking reductions down to K = ``--min-k``
at any number of rows (before session 24 the shipped bound was 128, which left the 56x56 1x1
convs over 64 channels on mma.sync; session 22 timed the
residual one alone at 47 us on wgmma against 64 us on mma.sync in the model), the rest of the
arguments those of ``tvmfuse bench``:

    python3 benchmarks/h200/min-k-ab.py --min-k 64 resnet50 --target cuda-sm90 --dtype fp16 \\
        --batch 32 --no-db --engines tvmfuse,torch-compile-cudagraphs --json OUT.json

An experiment's switch, not an option of tvmfuse: the pass's default is changed in this process
only, before the build.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tvmfuse.cli import main  # noqa: E402
from tvmfuse.strategy import cuda  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-k", type=int, required=True)
    args, rest = parser.parse_known_args()
    shipped = cuda.UseWgmmaGemms
    cuda.UseWgmmaGemms = lambda target: shipped(  # the strategy's call, one K bound at any rows
        target, min_k=args.min_k, shallow_k=args.min_k)
    sys.exit(main(["bench", *rest]))
