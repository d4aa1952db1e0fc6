#!/bin/bash
# Session 22, GPU call 1: numeric tests of the mma kernels after the cp.async change and of the
# space-to-depth stem, then the mma GEMM at 4096^3 over four tiles (8-warp blocks and 4 stages
# retried now that a copy costs fewer instructions) and BERT b32's FFN GEMMs on the auto tile.
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_matmul.py \
    tests/schedules/test_cuda_conv.py -k numbers 2>&1 | tail -4 | tee "$OUT/pytest.log"
timeout 170 python3 benchmarks/cuda_gemm.py --no-dlight --shapes 4096,4096,4096 \
    --tiles auto,2x4x4x4x4x3,4x2x4x4x4x3,2x2x4x4x4x4 --json "$OUT/cuda-gemm-4096.json" 2>&1 \
    | grep -v Warning | tee "$OUT/gemm-4096.log"
timeout 100 python3 benchmarks/cuda_gemm.py --no-dlight --shapes "4096,3072,768;4096,768,3072" \
    --json "$OUT/cuda-gemm-bert.json" 2>&1 | grep -v Warning | tee "$OUT/gemm-bert.log"
