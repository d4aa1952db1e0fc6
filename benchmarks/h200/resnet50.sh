#!/bin/bash
# On the GPU host: ResNet-50 fp16 at batch 1 and 32, tvmfuse next to torch.compile (default mode
# and CUDA graphs). Results go to $OUT (default /tmp/h200).
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
for batch in ${BATCHES:-1 32}; do
    timeout 280 python3 -m tvmfuse bench resnet50 --target cuda-sm90 --dtype fp16 \
        --batch "$batch" --no-db --engines tvmfuse,torch-compile,torch-compile-cudagraphs \
        --json "$OUT/resnet50-cuda-sm90-fp16-b$batch.json" 2>&1 | grep -v Warning | tail -12
done
