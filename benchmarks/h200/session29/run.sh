#!/bin/bash
# Session 29's GPU calls (run from the project root on the host; results to $OUT):
#   run.sh errors  the four suite builds whose error on the GPU was above PyTorch eager's on the one
#                  example input (session 28), over six other inputs on the GPU, both sides there
#                  (errors_over_inputs.py); then BERT-base fp16 b32 against torch.compile + CUDA
#                  graphs (#17's numbers, re-measured after sessions 27-28's changes)
#   run.sh resnet  ResNet-50 fp16 at batch 32 and batch 1, the same way
#   run.sh bert1   BERT-base fp16 at batch 1
#   run.sh diverge (next session) Llama prefill fp16's every kernel launch recorded on the GPU
#                  (kernel_outputs.py), to compare here with the CPU build's: which kernel makes
#                  its keys output 2.2x less accurate on the GPU than on the CPU
#   run.sh widen   after WidenElementwise (Llama's SiLU gate in float32, its output projections'
#                  sums kept): Llama prefill fp16 over six inputs on the GPU, and the suite's
#                  small configs in fp16 and bf16 against PyTorch (tests/test_suite.py -k cuda)
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
H=benchmarks/h200
case "$1" in
errors)
    E="python3 $H/session28/errors_over_inputs.py"
    timeout 200 $E llama_prefill_small float16 cuda-sm90 > "$OUT/inputs-llama.log" 2>&1 &
    timeout 200 $E swin_small float16 cuda-sm90 > "$OUT/inputs-swin.log" 2>&1 &
    timeout 200 $E regnet_small bfloat16 cuda-sm90 > "$OUT/inputs-regnet.log" 2>&1 &
    timeout 200 $E vit_small bfloat16 cuda-sm90 > "$OUT/inputs-vit.log" 2>&1 &
    wait
    grep -h "mean ratio" "$OUT"/inputs-*.log || tail -5 "$OUT"/inputs-*.log
    bash $H/run.sh b32-bert ;;
resnet) bash $H/run.sh b32-resnet; bash $H/run.sh b1-resnet ;;
bert1) bash $H/run.sh b1-bert ;;
diverge)
    # the same import on the host's CPU too: whether the host's own torch/transformers change it
    K="python3 $H/session29/kernel_outputs.py record benchmarks/suite/models.py:llama_prefill_small"
    timeout 300 $K float16 cuda-sm90 "$OUT/llama-fp16-gpu.npz" > "$OUT/record-gpu.log" 2>&1 &
    timeout 300 $K float16 x86-64 "$OUT/llama-fp16-hostcpu.npz" > "$OUT/record-hostcpu.log" 2>&1 &
    timeout 300 python3 $H/session28/errors_over_inputs.py llama_prefill_small float16 x86-64 \
        > "$OUT/inputs-llama-hostcpu.log" 2>&1 &
    wait
    tail -n 3 "$OUT"/record-*.log "$OUT"/inputs-llama-hostcpu.log ;;
widen)
    PYTEST="python3 -m pytest -q -p no:cacheprovider -W ignore"
    timeout 200 python3 $H/session28/errors_over_inputs.py llama_prefill_small float16 cuda-sm90 \
        > "$OUT/inputs-llama-widened.log" 2>&1 &
    timeout 420 $PYTEST tests/test_suite.py -k "cuda and not bfloat16" > "$OUT/pytest-suite-fp16.log" 2>&1 &
    timeout 420 $PYTEST tests/test_suite.py -k "cuda and bfloat16" > "$OUT/pytest-suite-bf16.log" 2>&1 &
    wait
    grep -h "mean ratio" "$OUT"/inputs-*.log || tail -5 "$OUT"/inputs-*.log
    for f in "$OUT"/pytest-*.log; do echo "== $f"; grep -E "^E  .*Assert|passed|failed" "$f" | tail -6; done ;;
*) echo "usage: run.sh errors|resnet|bert1|widen|diverge" >&2; exit 2 ;;
esac
