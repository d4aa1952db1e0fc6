#!/bin/bash
# Session 21's third GPU round (on the host, after staging): the wgmma kernels' numeric tests
# (the shallow-K two-block tiles among them), ResNet-50 fp16 at batch 32 and 1 now that its 1x1
# convs with K = 128-256 take wgmma, then BERT-base in bf16 at batch 32. Results to $OUT.
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_wgmma.py \
    -k numbers 2>&1 | tail -4 | tee "$OUT/pytest-wgmma.log"
bench() {  # model batch dtype seconds
    timeout "$4" python3 -m tvmfuse bench "$1" --target cuda-sm90 --dtype "$3" --batch "$2" \
        --no-db --engines tvmfuse,torch-compile-cudagraphs \
        --json "$OUT/$1-cuda-sm90-$3-b$2.json" 2>&1 | grep -v Warning | tail -6
}
bench resnet50 32 fp16 150
bench resnet50 1 fp16 110
bench bert-base 32 bf16 140
