#!/bin/bash
# Session 25's GPU calls (run from the project root on the host; results to $OUT):
#   run.sh tests   every CUDA test file with GPU-only numeric tests (session 24 wrote the mma
#                  pass tests, its fused-kernel numbers and the shared check_linear_gelu after
#                  its GPU time ran out)
#   run.sh mma     BERT-base fp16 b1 with rule mma_gemm on and off, twice alternating
#   run.sh ln      LayerNorm in the wgmma GEMM's epilogue (schedules/cuda/row_norm.py): its
#                  numeric tests, this session's fixed tests (attention at 128-wide heads in 4
#                  warps, the mma pass's bf16 case); then BERT-base fp16 b32 with it
#                  (cuda-layer-norm-epilogue-on.toml) and without (the default)
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
case "$1" in
tests)
    timeout 420 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_mma_gemm.py \
        tests/schedules/test_cuda_wgmma.py tests/schedules/test_cuda_matmul.py \
        tests/schedules/test_cuda_conv.py tests/schedules/test_cuda_rows.py \
        tests/schedules/test_cuda_flash_attention.py tests/passes/test_fuse_attention.py \
        2>&1 | tail -25 | tee "$OUT/pytest-gpu-files.log" ;;
mma)
    for round in 1 2; do
        for rules in on off; do
            extra=(); [ $rules = on ] && extra=(--fusion-rules benchmarks/cuda-mma-gemm-on.toml)
            timeout 200 python3 -m tvmfuse bench bert-base --batch 1 --target cuda-sm90 \
                --dtype fp16 --no-db --engines tvmfuse,torch-compile-cudagraphs "${extra[@]}" \
                --json "$OUT/bert-base-fp16-b1-mma-$rules-$round.json" 2>&1 | grep -v Warning | tail -4
        done
    done ;;
ln)
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_row_norm.py \
        tests/schedules/test_cuda_flash_attention.py tests/schedules/test_cuda_mma_gemm.py \
        -k "numbers or verifies" 2>&1 | tail -15 | tee "$OUT/pytest-ln.log"
    # the rule on and off alternating (one call each took 230 s with the torch peer's compile:
    # the peer is left out; session 25's run with it: BENCHMARKS.md)
    for rules in on off; do
        extra=(); [ $rules = on ] && extra=(--fusion-rules benchmarks/cuda-layer-norm-epilogue-on.toml)
        timeout 280 python3 -m tvmfuse bench bert-base --batch 32 --target cuda-sm90 --dtype fp16 \
            --no-db --engines tvmfuse "${extra[@]}" \
            --json "$OUT/bert-base-fp16-b32-ln-$rules.json" 2>&1 | grep -v Warning | tail -3
    done ;;
*) echo "usage: run.sh tests|mma|ln" >&2; exit 2 ;;
esac
