#!/bin/bash
# On the GPU host: the wgmma conv tests, then ResNet-50 fp16 with and without the downsample
# conv merge on CUDA (benchmarks/cuda-horizontal-conv-off.toml: 47 wgmma launches and 7 mma.sync
# instead of 41 and 9), at batch 32 and 1, next to torch.compile + CUDA graphs. Results to $OUT.
# The build takes 105-120 s on the host: each bench needs about 200 s.
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_wgmma.py \
    -k conv_numbers 2>&1 | tail -4 | tee "$OUT/pytest-wgmma-conv.log"
bench() {  # batch name [rules]
    timeout 230 python3 -m tvmfuse bench resnet50 --target cuda-sm90 --dtype fp16 --batch "$1" \
        --no-db --engines tvmfuse,torch-compile-cudagraphs ${3:+--fusion-rules "$3"} \
        --json "$OUT/resnet50-fp16-b$1-$2.json" 2>&1 | grep -v Warning | tail -5
}
bench 32 merged
bench 32 unmerged benchmarks/cuda-horizontal-conv-off.toml
bench 1 "${B1_NAME:-merged}" ${B1_RULES:-}
