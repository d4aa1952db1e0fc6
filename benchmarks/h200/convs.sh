#!/bin/bash
# On the GPU host: the wgmma conv kernels' numeric tests, then ResNet-50's convs at batch 32 on
# each engine of benchmarks/cuda_conv.py next to cuDNN: the 3x3 convs, and the 1x1 convs with K
# below UseWgmmaGemms' min_k (on mma.sync today) with one- and two-block wgmma tiles. The mma
# builds import TVM's tensor-core intrinsics first (tens of seconds). Results go to $OUT.
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_wgmma.py \
    -k "conv_numbers" 2>&1 | tail -8 | tee "$OUT/pytest-wgmma-conv.log"
timeout "${CONV_SECONDS:-400}" python3 benchmarks/cuda_conv.py \
    --engines "${ENGINES:-wgmma,wg64x4x1x2,wg128x4x1x2,mma}" --json "$OUT/cuda-conv.json" 2>&1 \
    | grep -av Warning | tee "$OUT/conv.log"
