#!/bin/bash
# On the GPU host: from Nsight Compute reports (arguments), the warp stall reasons per issued
# instruction and the source page's SASS with its memory counters (gzipped) to $OUT.
OUT=${OUT:-/tmp/h200}; mkdir -p "$OUT"
for rep in "$@"; do
    name=$(basename "$rep" .ncu-rep)
    ncu --import "$rep" --page raw --csv > "$OUT/$name-raw.csv" 2>&1
    python3 - "$OUT/$name-raw.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head, units, values = rows[0], rows[1], rows[2]
pick = [(h, v) for h, v in zip(head, values)
        if "issue_stalled" in h and h.endswith((".pct", ".ratio")) and "pcsamp" not in h or
        h.startswith(("sm__pipe_tensor", "sm__inst_executed_pipe_tensor", "l1tex__data_bank",
                      "smsp__inst_executed.sum", "sm__throughput", "lts__t_sectors_srcunit_tex_op_read.sum",
                      "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts", "smsp__sass_inst_executed_op_ldgsts"))]
for h, v in sorted(pick, key=lambda p: p[0]):
    print(f"{h:90s} {v}")
PY
    ncu --import "$rep" --page source --csv --print-source sass 2>/dev/null | gzip > "$OUT/$name-source.csv.gz"
done
