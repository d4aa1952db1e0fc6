#!/bin/bash
# Session 21's second GPU round (on the host, after staging): the mma.sync GEMM's numeric tests
# (with a three-blocks-an-SM tile), its tiles bounded to three or four blocks an SM against
# today's choice at 4096^3 and BERT's batch-32 shapes, Nsight Compute on the three-block tile,
# then BERT-base fp16 b32. Results to $OUT.
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_matmul.py \
    -k numbers 2>&1 | tail -4 | tee "$OUT/pytest-matmul.log"
timeout 200 python3 benchmarks/cuda_gemm.py --weight-nk --no-dlight \
    --shapes "4096,4096,4096;4096,3072,768;4096,768,3072;4096,2304,768" \
    --tiles auto,2x2x4x4x2x3x3,2x2x4x4x4x2x3,2x2x4x2x2x3x4 --json "$OUT/cuda-gemm-bounded.json" \
    2>&1 | grep -v Warning | tee "$OUT/gemm.log"
timeout 100 ncu --set full -k regex:main_kernel -c 1 -f -o "$OUT/ncu-mma3" \
    python3 benchmarks/cuda_gemm.py --shapes 4096,4096,4096 --tiles 2x2x4x4x2x3x3 --no-dlight \
    --weight-nk --json /tmp/ncu-gemm.json 2>&1 | grep -v Warning | tail -2
bash benchmarks/h200/session21/ncu-stalls.sh "$OUT/ncu-mma3.ncu-rep" | tee "$OUT/ncu-mma3-stalls.log"
timeout 170 python3 -m tvmfuse bench bert-base --target cuda-sm90 --dtype fp16 --batch 32 \
    --no-db --engines tvmfuse,torch-compile-cudagraphs --json "$OUT/bert-base-cuda-sm90-fp16-b32.json" \
    2>&1 | grep -v Warning | tail -8
