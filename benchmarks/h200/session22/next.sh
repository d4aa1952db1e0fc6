#!/bin/bash
# What session 22 left for the GPU (run from the project root on the host; results to $OUT):
#   next.sh tests   the wgmma numeric tests (the 72-channel strided conv that replaced the
#                   40-channel one), the mma/conv ones, the space-to-depth stem's
#   next.sh bert    BERT-base fp16 b32 (its residual GEMMs read the residual as rows since
#                   3aa2adb: not yet run on the GPU), then ResNet-50 b1
#   next.sh mink    ResNet-50 b32 with UseWgmmaGemms taking K >= 64 (benchmarks/h200/min-k-ab.py)
#                   beside the shipped K >= 128, one run each
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
bench() {  # json-name args...
    local name=$1; shift
    timeout 240 python3 -m tvmfuse bench "$@" --target cuda-sm90 --dtype fp16 --no-db \
        --engines tvmfuse,torch-compile-cudagraphs --json "$OUT/$name.json" 2>&1 \
        | grep -v Warning | tail -4
}
case "$1" in
tests)
    timeout 280 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_wgmma.py \
        tests/schedules/test_cuda_matmul.py tests/schedules/test_cuda_conv.py -k numbers 2>&1 \
        | tail -5 | tee "$OUT/pytest.log" ;;
bert) bench bert-base-fp16-b32 bert-base --batch 32; bench resnet50-fp16-b1 resnet50 --batch 1 ;;
mink)
    for k in 64 128; do
        timeout 240 python3 benchmarks/h200/min-k-ab.py --min-k $k resnet50 --target cuda-sm90 \
            --dtype fp16 --batch 32 --no-db --engines tvmfuse,torch-compile-cudagraphs \
            --json "$OUT/resnet50-fp16-b32-min-k-$k.json" 2>&1 | grep -v Warning | tail -3
    done ;;
*) echo "usage: next.sh tests|bert|mink" >&2; exit 2 ;;
esac
