#!/bin/bash
# On the GPU host (see ../../README.md, "The GPU machine"): the CUDA kernels' numeric tests, then
# the fp16 GEMM benchmark (benchmarks/cuda_gemm.py). Results go to $OUT (default /tmp/h200).
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_matmul.py \
    tests/passes/test_fuse_attention.py -k "numbers or cuda" 2>&1 | tail -15 | tee "$OUT/pytest.log"
timeout 300 python3 benchmarks/cuda_gemm.py --json "$OUT/cuda-gemm.json" 2>&1 \
    | grep -v Warning | tee "$OUT/gemm.log"
