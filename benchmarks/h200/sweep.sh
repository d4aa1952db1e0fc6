#!/bin/bash
# On the GPU host: the tensor-core GEMM's tiles side by side (benchmarks/cuda_gemm.py --tiles) at
# 4096^3 and at BERT-base's and ResNet-50's batch-32 GEMM shapes, B stored [N, K] as the models
# store weights. Results go to $OUT (default /tmp/h200); the JSON is rewritten after each shape.
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
TILES=${TILES:-auto,2x2x4x4x4x3,2x2x4x4x2x4,2x2x4x4x4x4,2x4x4x4x2x3,2x4x4x4x4x3,2x4x4x4x2x4,4x2x4x4x4x3,2x4x4x2x4x3,4x2x2x4x4x3}
SHAPES=${SHAPES:-"4096,4096,4096;4096,3072,768;4096,768,3072;4096,2304,768;4096,768,768;100352,256,64;1568,512,2048"}
timeout "${SWEEP_SECONDS:-420}" python3 benchmarks/cuda_gemm.py --no-dlight --weight-nk \
    --tiles "$TILES" --shapes "$SHAPES" --json "$OUT/cuda-gemm-tiles.json" 2>&1 \
    | grep -v Warning | tee "$OUT/sweep.log"
