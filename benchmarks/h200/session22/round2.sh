#!/bin/bash
# Session 22, GPU call 2 (the first of a fresh host's third call): the wgmma kernel's numeric
# tests (the residual read as rows: 16-byte loads at the output's own address), then ResNet-50
# fp16 b32 against torch.compile + CUDA graphs. `round2.sh sweep` (a second call): ResNet's
# residual 1x1 convs on mma.sync and wgmma (is K = 64 wgmma's now?).
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
case "${1:-bench}" in
bench)
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_wgmma.py \
        -k numbers 2>&1 | tail -4 | tee "$OUT/pytest-wgmma.log"
    timeout 240 python3 -m tvmfuse bench resnet50 --target cuda-sm90 --dtype fp16 --batch 32 \
        --no-db --engines tvmfuse,torch-compile-cudagraphs \
        --json "$OUT/resnet50-fp16-b32-rows.json" 2>&1 | grep -v Warning | tail -4 ;;
sweep)
    timeout 200 python3 benchmarks/cuda_conv.py --residual --engines mma,wgmma,wg128x4x1x2,wg256x4x1x1 \
        --shapes "32,56,56,64,256,1,1;32,28,28,128,512,1,1;32,14,14,256,1024,1,1;32,7,7,512,2048,1,1" \
        --json "$OUT/cuda-conv-residual.json" 2>&1 | grep -v Warning | tee "$OUT/conv-residual.log" ;;
esac
