#!/bin/bash
# Session 30's GPU calls (run from the project root on the host; results to $OUT):
#   run.sh check   after FoldCreationOps (aranges and fills constants before the precision
#                  changes, so rotary tables fold in float32): Llama prefill fp16 over six inputs
#                  on the GPU, and the suite's small configs in fp16 and bf16 against PyTorch
#                  (tests/test_suite.py -k cuda)
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
H=benchmarks/h200
PYTEST="python3 -m pytest -q -p no:cacheprovider -W ignore"
case "$1" in
check)
    for dtype in float16 bfloat16; do
        timeout 240 python3 $H/session28/errors_over_inputs.py llama_prefill_small $dtype cuda-sm90 \
            > "$OUT/inputs-llama-$dtype.log" 2>&1 &
    done
    timeout 450 $PYTEST tests/test_suite.py -k "cuda and not bfloat16" > "$OUT/pytest-suite-fp16.log" 2>&1 &
    timeout 450 $PYTEST tests/test_suite.py -k "cuda and bfloat16" > "$OUT/pytest-suite-bf16.log" 2>&1 &
    wait
    grep -h "mean ratio\|each output" "$OUT"/inputs-*.log || tail -5 "$OUT"/inputs-*.log
    for f in "$OUT"/pytest-*.log; do echo "== $f"; grep -E "^E  .*Assert|passed|failed" "$f" | tail -6; done ;;
*) echo "usage: run.sh check" >&2; exit 2 ;;
esac
