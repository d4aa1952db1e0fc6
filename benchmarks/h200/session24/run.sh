#!/bin/bash
# Session 24's GPU calls (run from the project root on the host; results to $OUT):
#   run.sh gemm    the hand-written mma.sync GEMM (schedules/cuda/mma_gemm.py): its numeric
#                  tests, then its tiles beside the TVM-scheduled mma kernel, wgmma and torch
#                  at 4096^3 and BERT-base's GEMMs (benchmarks/cuda_gemm.py)
#   run.sh small   its smaller tiles beside the TVM-scheduled kernel at the GEMMs the wgmma
#                  kernel leaves to mma.sync (fewer than 1024 rows: BERT b1, ViT, ResNet-50 b1's
#                  1x1 convs, the classifier), then ResNet-50 b1 with wgmma taking K >= 64
#   run.sh mma     what this session left for the GPU: the mma kernel's tests (the pass and the
#                  fused-kernel numbers were added after the GPU time ran out), then BERT-base
#                  fp16 b1 and ViT-sized GEMMs with rule mma_gemm on and off (one run each)
#   run.sh tests|bert|mink   session 22's plan (benchmarks/h200/session22/next.sh)
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
case "$1" in
gemm)
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_mma_gemm.py \
        2>&1 | tail -15 | tee "$OUT/pytest-mma-gemm.log"
    timeout 360 python3 benchmarks/cuda_gemm.py --no-dlight --weight-nk \
        --shapes "4096,4096,4096;4096,3072,768;4096,768,3072;4096,2304,768;128,3072,768" \
        --tiles "${TILES:-auto,mk,mk2x2x64x64x3,mk2x2x64x64x4,mk4x2x64x64x3,wgmma}" \
        --json "$OUT/cuda-gemm.json" 2>&1 | grep -v Warning | tee "$OUT/gemm.log" ;;
small)
    timeout 300 python3 benchmarks/cuda_gemm.py --no-dlight --weight-nk \
        --shapes "128,2304,768;128,3072,768;128,768,3072;128,768,768;197,768,768;197,3072,768;32,1000,2048;49,2048,512;196,1024,256;784,512,128;784,128,512" \
        --tiles "auto,mk2x2x32x32x4,mk2x2x32x64x4,mk2x2x64x32x4,mk1x2x64x64x4,mk2x2x64x64x4,mk1x4x32x32x4" \
        --json "$OUT/cuda-gemm-small.json" 2>&1 | grep -v Warning | tee "$OUT/gemm-small.log"
    for k in 64 128; do
        timeout 150 python3 benchmarks/h200/min-k-ab.py --min-k $k resnet50 --target cuda-sm90 \
            --dtype fp16 --batch 1 --no-db --engines tvmfuse,torch-compile-cudagraphs \
            --json "$OUT/resnet50-fp16-b1-min-k-$k.json" 2>&1 | grep -v Warning | tail -3
    done ;;
mma)
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_mma_gemm.py \
        2>&1 | tail -15 | tee "$OUT/pytest-mma-gemm.log"
    for rules in on off; do
        extra=(); [ $rules = on ] && extra=(--fusion-rules benchmarks/cuda-mma-gemm-on.toml)
        timeout 200 python3 -m tvmfuse bench bert-base --batch 1 --target cuda-sm90 --dtype fp16 \
            --no-db --engines tvmfuse,torch-compile-cudagraphs "${extra[@]}" \
            --json "$OUT/bert-base-fp16-b1-mma-$rules.json" 2>&1 | grep -v Warning | tail -4
    done ;;
tests|bert|mink) bash benchmarks/h200/session22/next.sh "$1" ;;
*) echo "usage: run.sh gemm|small|mma|tests|bert|mink" >&2; exit 2 ;;
esac
