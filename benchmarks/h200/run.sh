#!/bin/bash
# On the GPU host, in parts that each fit one device call (results and logs to $OUT):
#   run.sh kernels  the CUDA kernels' numeric tests, then the fp16 GEMM table (cuda_gemm.py)
#   run.sh b32      ResNet-50 and BERT-base fp16 at batch 32 against torch.compile + CUDA graphs
#   run.sh b1       the same at batch 1, then BERT-base b32's kernels timed alone
#   run.sh b32-resnet, b32-bert, b1-resnet, b1-bert: one of those benches
#   run.sh short    the numeric tests of the CUDA kernels, then BERT-base b32, b1, ResNet-50 b32
#                   (what a session's last few device minutes hold)
# ENGINES overrides the peers (default: tvmfuse,torch-compile-cudagraphs, the fastest peer in
# every row sessions 11-15 measured; add torch-compile for the default mode).
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
ENGINES=${ENGINES:-tvmfuse,torch-compile-cudagraphs}
# ResNet-50's build takes 105-120 s on the host since its 1x1 convs with K = 128-256 became
# wgmma kernels (session 21: two runs killed at 150 and 110 s); BERT-base's about 90 s
bench() {  # model batch seconds
    timeout "$3" python3 -m tvmfuse bench "$1" --target cuda-sm90 --dtype fp16 --batch "$2" \
        --no-db --engines "$ENGINES" --json "$OUT/$1-cuda-sm90-fp16-b$2.json" 2>&1 \
        | grep -v Warning | tail -9
}
numeric_tests() {  # seconds files...
    local seconds=$1; shift
    timeout "$seconds" python3 -m pytest -q -p no:cacheprovider "$@" -k "numbers or cuda" 2>&1 \
        | tail -6 | tee "$OUT/pytest.log"
}
case "$1" in
kernels)
    numeric_tests 170 tests/schedules/test_cuda_matmul.py tests/schedules/test_cuda_conv.py \
        tests/passes/test_fuse_attention.py
    timeout 120 python3 benchmarks/cuda_gemm.py --no-dlight --json "$OUT/cuda-gemm.json" 2>&1 \
        | grep -v Warning > "$OUT/gemm.log"
    grep -A2 "^square\|BERT b32\|ResNet b32" "$OUT/gemm.log"
    # two stages at 4096^3 (three blocks of 74 KB an SM instead of two of 110 KB)
    timeout 60 python3 benchmarks/cuda_gemm.py --no-dlight --shapes 4096,4096,4096 \
        --tiles auto,2x2x4x4x4x2 --json "$OUT/cuda-gemm-4096.json" 2>&1 \
        | grep -v Warning
    ;;
b32) bench resnet50 32 240; bench bert-base 32 200 ;;
b32-resnet) bench resnet50 32 240 ;;
b32-bert) bench bert-base 32 200 ;;
b1-resnet) bench resnet50 1 220 ;;
b1-bert) bench bert-base 1 170 ;;
b1)
    bench resnet50 1 220; bench bert-base 1 170
    MODELS=bert-base BATCH=32 PROFILE_SECONDS=170 bash benchmarks/h200/profile.sh
    ;;
short)
    numeric_tests 110 tests/schedules/test_cuda_rows.py tests/schedules/test_cuda_matmul.py \
        tests/passes/test_fuse_attention.py
    bench bert-base 32 150; bench bert-base 1 140; bench resnet50 32 220
    ;;
*) echo "usage: run.sh kernels|b32|b1|short|b32-resnet|b32-bert|b1-resnet|b1-bert" >&2; exit 2 ;;
esac
