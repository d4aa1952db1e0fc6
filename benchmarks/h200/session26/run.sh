#!/bin/bash
# Session 26's GPU calls (run from the project root on the host; results to $OUT):
#   run.sh ln      the LayerNorm epilogue's numeric tests (with the remote partial sums now
#                  loaded a lane a row, all in flight at once), then benchmarks/cuda_row_norm.py:
#                  the fused kernel against the GEMM + LayerNorm kernel pair at BERT's shapes
#   run.sh ln2     the same after the epilogue's rewrite (the row elements computed in the plain
#                  epilogue's spread, sums from conflict-free shared loads, the store spread
#                  again), with tiles and row counts around the wave step (3584 -> 4096 rows)
#   run.sh precision  BERT-base b32 fp16 and bf16 beside PyTorch eager and torch.compile with
#                  CUDA graphs after WidenEpilogues (bias and GELU on the float32 sums): the
#                  errors against PyTorch float32 (session 21: bf16 9.65e-3 vs PyTorch's 9.50e-3)
#   run.sh bert    BERT-base fp16 b32 with the rule on and off (no torch peer: its compile
#                  alone takes ~60 s; session 25's peer: 2.71 ms)
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
case "$1" in
ln)
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_row_norm.py \
        2>&1 | tail -8 | tee "$OUT/pytest-ln.log"
    timeout 330 python3 benchmarks/cuda_row_norm.py --tiles auto,192x3x1x2,128x4x2x1 \
        --json "$OUT/cuda-row-norm.json" 2>&1 | grep -v Warning ;;
ln2)
    timeout 260 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_row_norm.py \
        tests/schedules/test_cuda_wgmma.py \
        -k "numbers or verifies" 2>&1 | tail -8 | tee "$OUT/pytest-ln2.log"
    timeout 330 python3 benchmarks/cuda_row_norm.py --rows 2048,3584,3840,3968,4096 \
        --tiles auto,256x4x2x1,256x2x1x2 --json "$OUT/cuda-row-norm-2.json" 2>&1 | grep -v Warning ;;
precision)
    for dtype in fp16 bf16; do
        timeout 285 python3 -m tvmfuse bench bert-base --batch 32 --target cuda-sm90 --dtype $dtype \
            --no-db --engines tvmfuse,torch-eager,torch-compile-cudagraphs \
            --json "$OUT/bert-base-$dtype-b32.json" 2>&1 | tr -d '\000' | grep -v Warning | tail -6
    done ;;
bert)
    for rules in on off; do
        extra=(); [ $rules = on ] && extra=(--fusion-rules benchmarks/cuda-layer-norm-epilogue-on.toml)
        timeout 290 python3 -m tvmfuse bench bert-base --batch 32 --target cuda-sm90 --dtype fp16 \
            --no-db --engines tvmfuse "${extra[@]}" \
            --json "$OUT/bert-base-fp16-b32-ln-$rules.json" 2>&1 | grep -v Warning | tail -3
    done ;;
*) echo "usage: run.sh ln|ln2|precision|bert" >&2; exit 2 ;;
esac
