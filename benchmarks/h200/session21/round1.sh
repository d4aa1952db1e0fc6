#!/bin/bash
# Session 21's first GPU call (on the host, after staging): Nsight Compute on the 4096^3 GEMMs,
# ResNet-50 fp16 at batch 1, then the 1x1 convs with K < 512 and the 7x7 3x3 conv on the wgmma
# tiles next to mma.sync and cuDNN. Results to $OUT.
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
bash benchmarks/h200/ncu.sh 2>&1 | tee "$OUT/ncu.log"
ENGINES=tvmfuse,torch-compile-cudagraphs
timeout 170 python3 -m tvmfuse bench resnet50 --target cuda-sm90 --dtype fp16 --batch 1 \
    --no-db --engines "$ENGINES" --json "$OUT/resnet50-cuda-sm90-fp16-b1.json" 2>&1 \
    | grep -v Warning | tail -9
timeout 170 python3 benchmarks/cuda_conv.py --engines wgmma,wg64x4x1x2,wg128x4x1x2,mma \
    --shapes "32,56,56,64,256,1,1;32,28,28,128,512,1,1;32,14,14,256,1024,1,1;32,56,56,256,64,1,1;32,7,7,512,512,3,1" \
    --json "$OUT/cuda-conv-1x1.json" 2>&1 | grep -av Warning | tee "$OUT/conv.log"
