#!/bin/bash
# Run one benchmark on the GPU host (see the device notes: the TVM wheel travels in parts under
# .device/, whose stage.sh installs it and sets PYTHONPATH). From the project root on the host:
#   bash benchmarks/gpu.sh models       ResNet-50 and BERT-base fp16 at batch 1 and 32 against
#                                       torch.compile + CUDA graphs (the GPU table's headline rows)
#   bash benchmarks/gpu.sh gemm|conv|row-norm   one CUDA kernel family's table
#   bash benchmarks/gpu.sh checks       the tests that need the GPU (fault naming, alignment,
#                                       the mma GEMM's numbers, SegFormer run), then Wav2Vec2,
#                                       SegFormer and BEiT fp16 builds with --verify; logs in $OUT
#                                       (a hang: benchmarks/cuda_trace.py on the build names it)
#   bash benchmarks/gpu.sh build-time   ResNet-50 and BERT-base fp16 CUDA builds, cold and rebuilt
#                                       unchanged, seconds per stage (benchmarks/build_time.py)
#   bash benchmarks/gpu.sh coverage [ARGS]  the coverage sweep's small configs in fp16 on the GPU,
#                                       resumed from $OUT/coverage.json (benchmarks/coverage.py)
#   bash benchmarks/gpu.sh COMMAND...   any command, e.g. python3 -m tvmfuse bench vit --target
#                                       cuda-sm90 --dtype fp16 --json $OUT/vit-fp16-b1.json
# JSON goes to $OUT (default /tmp/gpu); copy it to benchmarks/results/<gpu>/ with the machine,
# commit and command (benchmarks/report.py's docstring) and run benchmarks/report.py. The host's
# git HEAD is not the tree it ran (the copy's .git lags): name the commit the call carried.
set -o pipefail
OUT=${OUT:-/tmp/gpu}; mkdir -p "$OUT"
for stage in .device/*/stage.sh; do
    [ -f "$stage" ] && source "$stage"
done
export PYTHONPATH=/root/tvmsite:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# the fastest peer of every row measured; add torch-compile for its default mode
ENGINES=${ENGINES:-tvmfuse,torch-compile-cudagraphs}
bench() {  # model dtype batch; a ResNet-50 build takes about two minutes on the host
    timeout 290 python3 -m tvmfuse bench "$1" --target cuda-sm90 --dtype "$2" --batch "$3" \
        --no-db --engines "$ENGINES" --json "$OUT/$1-$2-b$3.json" 2>&1 | grep -v Warning | tail -9
}
gpu_kind() {  # h100 or h200, as benchmarks/results/ names the GPU kinds
    nvidia-smi --query-gpu=name --format=csv,noheader | grep -oE 'H[0-9]00' | head -1 | tr H h
}
check() {  # name seconds command...: one check, its log in $OUT, its last lines here
    local name=$1 limit=$2 start; shift 2; start=$(date +%s)
    timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "== $name rc=$? $(( $(date +%s) - start )) s"
    grep -E "passed|failed|FAILED|ERROR|build time|verified" "$OUT/$name.log" | tail -n 12
}
case "$1" in
checks)
    python3 -c "import xdist" 2>/dev/null || python3 -m pip install -q --no-index --no-deps \
        --target /root/tvmsite /root/tvmparts/{pytest,pluggy,iniconfig,execnet,pytest_xdist}-*.whl
    # four pytest workers of four TVM threads: TVM's pool spins, so more threads than cores
    # (every worker taking all 16) slowed the run past its limit
    TVM_NUM_THREADS=4 check pytest-gpu 300 python3 -m pytest -q -p no:cacheprovider -rf -n 4 \
        tests/test_cuda_fault.py tests/test_cuda_alignment.py tests/schedules/test_cuda_matmul.py \
        tests/schedules/test_cuda_wgmma.py::test_conv_over_a_long_row_lowers_in_int32 \
        tests/test_suite.py::test_segformer_on_cuda_runs_and_verifies
    for model in wav2vec2 segformer beit; do
        check "build-$model" 120 python3 -m tvmfuse build "benchmarks/gpu_models.py:$model" \
            --target cuda-sm90 --dtype fp16 --no-db --verify -o "/tmp/gpu-check-$model"
    done ;;
models) for b in 1 32; do bench resnet50 fp16 "$b"; bench bert-base fp16 "$b"; done ;;
gemm) python3 benchmarks/cuda_gemm.py --no-dlight --json "$OUT/cuda-gemm.json" ;;
conv) python3 benchmarks/cuda_conv.py --json "$OUT/cuda-conv.json" ;;
row-norm) python3 benchmarks/cuda_row_norm.py --json "$OUT/cuda-row-norm.json" ;;
coverage) shift
    # JOBS model types at a time (default eight, each build on two of the host's 16 cores), only
    # those the CPU sweep CPU_SWEEP exported (the rest fail before a build, on any target)
    [ -f "$OUT/coverage.json" ] || cp "benchmarks/results/$(gpu_kind)/coverage.json" "$OUT/" 2>/dev/null
    TVM_NUM_THREADS=2 python3 benchmarks/coverage.py --target cuda-sm90 --dtype fp16 --paths torch \
        --jobs "${JOBS:-8}" --timeout 240 --resume --kind "$(gpu_kind)" --json "$OUT/coverage.json" \
        --exported-in "${CPU_SWEEP:-benchmarks/results/zen4/coverage.json}" "$@" 2>&1 |
        grep -vE "^\s+torch: verified" ;;
build-time) python3 benchmarks/build_time.py --target cuda-sm90 --dtype fp16 --kind "$(gpu_kind)" \
    --json "$OUT/build-time.json" ;;
"") echo "usage: gpu.sh models|checks|build-time|gemm|conv|row-norm|COMMAND..." >&2; exit 2 ;;
*) "$@" ;;
esac
