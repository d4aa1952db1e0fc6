#!/bin/bash
# Run one benchmark on the GPU host (see the device notes: the TVM wheel travels in parts under
# .device/, whose stage.sh installs it and sets PYTHONPATH). From the project root on the host:
#   bash benchmarks/gpu.sh models       ResNet-50 and BERT-base fp16 at batch 1 and 32 against
#                                       torch.compile + CUDA graphs (the GPU table's headline rows)
#   bash benchmarks/gpu.sh gemm|conv|row-norm   one CUDA kernel family's table
#   bash benchmarks/gpu.sh COMMAND...   any command, e.g. python3 -m tvmfuse bench vit --target
#                                       cuda-sm90 --dtype fp16 --json $OUT/vit-fp16-b1.json
# JSON goes to $OUT (default /tmp/gpu); copy it to benchmarks/results/<gpu>/ with the machine,
# commit and command (benchmarks/report.py's docstring) and run benchmarks/report.py.
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
case "$1" in
models) for b in 1 32; do bench resnet50 fp16 "$b"; bench bert-base fp16 "$b"; done ;;
gemm) python3 benchmarks/cuda_gemm.py --no-dlight --json "$OUT/cuda-gemm.json" ;;
conv) python3 benchmarks/cuda_conv.py --json "$OUT/cuda-conv.json" ;;
row-norm) python3 benchmarks/cuda_row_norm.py --json "$OUT/cuda-row-norm.json" ;;
"") echo "usage: gpu.sh models|gemm|conv|row-norm|COMMAND..." >&2; exit 2 ;;
*) "$@" ;;
esac
