#!/bin/bash
# On the GPU host: where the 4096^3 fp16 GEMM's time goes, Nsight Compute's full set for one
# launch each of our mma.sync kernel (the tile choose_tile takes), our wgmma kernel and
# torch.matmul's; reports (.ncu-rep) and their details pages (text) go to $OUT. Without ncu on
# the host it says so and stops. The GPU's clocks first (the TFLOP/s ceilings depend on them).
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv \
    | tee "$OUT/clocks.csv"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$NCU" ]; then echo "no ncu on this host"; exit 0; fi
profile() {  # name tiles kernel-regex
    timeout 150 "$NCU" --set full -k "regex:$3" -c 1 -f -o "$OUT/ncu-$1" \
        python3 benchmarks/cuda_gemm.py --shapes 4096,4096,4096 --tiles "$2" --no-dlight \
        --weight-nk --json "$OUT/ncu-$1-gemm.json" 2>&1 | grep -v Warning | tail -4
    "$NCU" --import "$OUT/ncu-$1.ncu-rep" --page details > "$OUT/ncu-$1.txt" 2>&1
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Registers|Achieved Occupancy|Shared Memory Configuration|Block Limit" \
        "$OUT/ncu-$1.txt" | head -14
}
profile mma 2x2x4x4x4x3 main_kernel
profile wgmma wgmma main_kernel
profile torch 2x2x4x4x4x3 '^(?!main_kernel).*(gemm|nvjet|cutlass|xmma|sm90).*'
