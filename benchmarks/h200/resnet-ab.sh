#!/bin/bash
# On the GPU host: ResNet-50 fp16 with and without the downsample conv merge on CUDA
# (benchmarks/cuda-horizontal-conv-off.toml: 47 wgmma launches and 7 mma.sync instead of 41 and
# 9), next to torch.compile + CUDA graphs; `b32` first runs the wgmma conv tests (the strided 1x1
# among them). One device call each (the build takes 105-120 s on the host: a bench ~200 s):
#   bash benchmarks/h200/resnet-ab.sh b32;  bash benchmarks/h200/resnet-ab.sh b1
# Results to $OUT.
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
bench() {  # batch name [rules]
    timeout 240 python3 -m tvmfuse bench resnet50 --target cuda-sm90 --dtype fp16 --batch "$1" \
        --no-db --engines tvmfuse,torch-compile-cudagraphs ${3:+--fusion-rules "$3"} \
        --json "$OUT/resnet50-fp16-b$1-$2.json" 2>&1 | grep -v Warning | tail -5
}
case "$1" in
b32)
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_wgmma.py \
        -k conv_numbers 2>&1 | tail -4 | tee "$OUT/pytest-wgmma-conv.log"
    bench 32 merged; bench 32 unmerged benchmarks/cuda-horizontal-conv-off.toml ;;
b1) bench 1 merged; bench 1 unmerged benchmarks/cuda-horizontal-conv-off.toml ;;
*) echo "usage: resnet-ab.sh b32|b1" >&2; exit 2 ;;
esac
