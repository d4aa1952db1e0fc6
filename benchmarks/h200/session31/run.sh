#!/bin/bash
# Session 31's GPU calls (run from the project root on the host; results to $OUT): #17 checked
# end to end at one commit, after session 30's FoldCreationOps.
#   run.sh tests  every GPU test: the CUDA kernels' numeric tests, the fused attention's, the GPU
#                 bench's, and the suite's small configs in fp16 and bf16 against PyTorch
#   run.sh b32    BERT-base s128 and ResNet-50 fp16 at batch 32 against torch.compile + CUDA graphs
#   run.sh b1     the same at batch 1
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
H=benchmarks/h200
PYTEST="python3 -m pytest -q -p no:cacheprovider -W ignore"
case "$1" in
tests)
    timeout 540 $PYTEST tests/schedules/test_cuda_*.py tests/passes/test_fuse_attention.py \
        "tests/test_bench.py::test_a_gpu_bench_leaves_the_model_on_the_cpu" \
        > "$OUT/pytest-cuda-kernels.log" 2>&1 &
    timeout 540 $PYTEST tests/test_suite.py -k "cuda and not bfloat16" > "$OUT/pytest-suite-fp16.log" 2>&1 &
    timeout 540 $PYTEST tests/test_suite.py -k "cuda and bfloat16" > "$OUT/pytest-suite-bf16.log" 2>&1 &
    wait
    for f in "$OUT"/pytest-*.log; do echo "== $f"; grep -E "^E  .*Assert|^FAILED|passed|failed" "$f" | tail -8; done ;;
b32) OUT=$OUT bash $H/run.sh b32-bert; OUT=$OUT bash $H/run.sh b32-resnet ;;
b1) OUT=$OUT bash $H/run.sh b1-resnet; OUT=$OUT bash $H/run.sh b1-bert ;;
*) echo "usage: run.sh tests|b32|b1" >&2; exit 2 ;;
esac
