#!/bin/bash
# On the GPU host: every kernel of ResNet-50 and BERT-base (fp16, batch 32) timed alone
# (`tvmfuse inspect --profile`), slowest first. Results go to $OUT (default /tmp/h200).
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
for model in ${MODELS:-resnet50 bert-base}; do
    json="$OUT/profile-$model-cuda-sm90-fp16-b${BATCH:-32}.json"
    timeout "${PROFILE_SECONDS:-240}" python3 -m tvmfuse inspect "$model" --target cuda-sm90 \
        --dtype fp16 --batch "${BATCH:-32}" --profile --no-db --json > "$json" \
        2> "$OUT/profile-$model.err" || tail -5 "$OUT/profile-$model.err"
    python3 - "$json" <<'PY'
import json, sys
kernels = json.load(open(sys.argv[1]))["kernels"]
total = sum(k["ms"] for k in kernels)
print(f"{sys.argv[1]}: {len(kernels)} kernels, {total:.3f} ms timed alone")
by_impl = {}
for k in kernels:
    by_impl[k["implementation"]] = by_impl.get(k["implementation"], 0) + k["ms"]
print("  by implementation:", {i: round(ms, 3) for i, ms in by_impl.items()})
for k in kernels[:25]:
    print(f"  {k['ms']:7.3f} ms x{k['launches']:<3d} {k['gflops'] or 0:9.0f} GF/s "
          f"{k['implementation']:18s} {k['kernel'][:70]}")
PY
done
