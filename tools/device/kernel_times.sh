#!/usr/bin/env bash
# Every launch's duration (ncu, the one counter, clocks left alone) of the kernels whose names
# match KERNELS, in launch order, during one `fvattn bench` (1 warm-up, 1 timed call per op), ON
# THE GPU MACHINE after `GPU_CHECK_STEPS=build tools/gpu-check`: where a whole op's time goes,
# small kernels included. KERNELS (regex, default the VSA backward's), SEQ (default 16384),
# BENCH_ARGS (the bench's shape options instead of --seq SEQ, e.g. "--ops layer --layer 8,30,52
# --heads 12 --topk 26"), BUILD_DIR (default build-gpu).
set -uo pipefail
B=${BUILD_DIR:-build-gpu}
mkdir -p "${OUT:-/tmp}"
out=${OUT:-/tmp}/times-${SEQ:-16384}
ncu --clock-control none --kernel-name "regex:${KERNELS:-vsa_bwd|vsa_invert|fva_delta}" \
  --metrics gpu__time_duration.sum --csv --page raw --log-file "$out.csv" \
  "$B/tools/fvattn" bench ${BENCH_ARGS:---seq ${SEQ:-16384} --kernels auto} --iters 1 --warmup 1 --no-sdpa \
  > "$out.err" 2>&1
python3 - "$out.csv" "${SEQ:-16384}" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r and not r[0].startswith("==")]
if len(rows) < 3:
    print("no ncu rows (see the .err log)"); sys.exit(0)
hdr, units, data = rows[0], rows[1], rows[2:]
i = hdr.index("gpu__time_duration.sum")
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3}[units[i]]
total = 0.0
for r in data:
    us = float(r[i].replace(",", "")) * scale
    total += us
    print(f"S={sys.argv[2]:<6} {r[hdr.index('Kernel Name')][:40]:<40} {us:>10.1f} us")
print(f"S={sys.argv[2]:<6} {'sum':<40} {total:>10.1f} us")
PY
