#!/bin/bash
# Session 27's GPU calls (run from the project root on the host; results to $OUT):
#   run.sh gemm       the mma.sync GEMM's numeric tests (with the K loop unrolled by its stages,
#                     new), then 4096^3 and BERT b32's GEMMs on the default tile with and without
#                     the unrolling, twice each, beside torch.matmul (benchmarks/cuda_gemm.py)
#   run.sh precision  BERT-base b32 fp16 and bf16 beside torch.compile with CUDA graphs and eager
#                     with the final WidenEpilogues (session 26 measured its first version)
#   run.sh gemm2      the same tests, then the default tile against its variants: the last slice's
#                     mmas before the step's barrier, and 128 x 128 blocks of 8 warps (64 x 32 or
#                     32 x 64), two blocks an SM (16 warps: 4 a scheduler, where the default has 2)
#   run.sh resnet     ResNet-50 fp16 b32 and b1 beside torch.compile with CUDA graphs (the final
#                     WidenEpilogues widens its folded BatchNorm's bias: not measured on the GPU before)
#   run.sh mobilenet  the 0-d epilogue parameters' tests (MobileNetV2's fp16 b32 build failed
#                     before), then MobileNetV2 fp16 b32 beside torch.compile with CUDA graphs
#   run.sh ncu        Nsight Compute's full set on one launch of the unrolled kernel at 4096^3
# The unrolled K loop (gemm's 7th tile field) and the mmas before the barrier (gemm2's 9th) were
# removed after these runs (slower / level): `git checkout b71bc34` to run gemm and gemm2 as
# they ran; today the 7th field is blocks_per_sm.
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
UNROLLED=${TILE:-mk2x4x64x64x4x0x1}
case "$1" in
gemm)
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_mma_gemm.py \
        2>&1 | tail -15 | tee "$OUT/pytest-mma-gemm.log"
    timeout 360 python3 benchmarks/cuda_gemm.py --no-dlight --weight-nk \
        --shapes "4096,4096,4096;4096,3072,768;4096,768,3072;4096,2304,768;4096,4096,4096" \
        --tiles "mk,$UNROLLED,mk,$UNROLLED" \
        --json "$OUT/cuda-gemm.json" 2>&1 | grep -v Warning | tee "$OUT/gemm.log" ;;
gemm2)
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_mma_gemm.py \
        2>&1 | tail -15 | tee "$OUT/pytest-mma-gemm2.log"
    timeout 330 python3 benchmarks/cuda_gemm.py --no-dlight --weight-nk \
        --shapes "4096,4096,4096;4096,3072,768;4096,768,3072;4096,2304,768;4096,4096,4096" \
        --tiles "mk,mk2x4x64x64x4x0x0x1x1,mk2x4x64x32x3x0x0x2,mk4x2x32x64x3x0x0x2,mk2x4x64x32x3x0x0x2x1" \
        --json "$OUT/cuda-gemm2.json" 2>&1 | grep -v Warning | tee "$OUT/gemm2.log" ;;
precision)
    for dtype in fp16 bf16; do
        timeout 290 python3 -m tvmfuse bench bert-base --batch 32 --target cuda-sm90 --dtype $dtype \
            --no-db --engines tvmfuse,torch-eager,torch-compile-cudagraphs \
            --json "$OUT/bert-base-$dtype-b32.json" 2>&1 | tr -d '\000' | grep -v Warning | tail -6
    done ;;
resnet)
    for b in 32 1; do
        timeout 270 python3 -m tvmfuse bench resnet50 --batch $b --target cuda-sm90 --dtype fp16 \
            --no-db --engines tvmfuse,torch-compile-cudagraphs --json "$OUT/resnet50-fp16-b$b.json" \
            2>&1 | tr -d '\000' | grep -v Warning | tail -5
    done ;;
mobilenet)
    timeout 90 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_cuda_wgmma.py -k zero_d \
        2>&1 | tail -3 | tee "$OUT/pytest-zero-d.log"
    timeout 230 python3 -m tvmfuse bench mobilenet_v2 --batch 32 --target cuda-sm90 --dtype fp16 \
        --no-db --engines tvmfuse,torch-compile-cudagraphs --json "$OUT/mobilenet_v2-fp16-b32.json" \
        2>&1 | tr -d '\000' | grep -v Warning | tail -5 ;;
ncu)
    NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    [ -z "$NCU" ] && { echo "no ncu on this host"; exit 0; }
    timeout 200 "$NCU" --set full --import-source yes -k "regex:^kernel_kernel" -c 1 -f \
        -o "$OUT/ncu-mku" python3 benchmarks/cuda_gemm.py --shapes 4096,4096,4096 \
        --tiles $UNROLLED --no-dlight --weight-nk --json "$OUT/ncu-mku-gemm.json" 2>&1 \
        | grep -v Warning | tail -4
    "$NCU" --import "$OUT/ncu-mku.ncu-rep" --page details > "$OUT/ncu-mku.txt" 2>&1
    "$NCU" --import "$OUT/ncu-mku.ncu-rep" --page source --csv --print-source sass \
        2>/dev/null | gzip > "$OUT/ncu-mku-source.csv.gz"
    grep -E "Duration|Compute \(SM\) Throughput|Registers|Achieved Occupancy|Issue Slots|No Eligible" \
        "$OUT/ncu-mku.txt" | head -14 ;;
*) echo "usage: run.sh gemm|gemm2|precision|resnet|mobilenet|ncu  (ncu: TILE=mk for the default tile)" >&2; exit 2 ;;
esac
