#!/usr/bin/env bash
# Executed SASS instructions per opcode of one kernel at the bench shape, ON THE GPU MACHINE after
# tools/gpu-check has built build-gpu: where an ALU-bound kernel's instructions go (which opcodes,
# and how many per score element). ncu's sass__inst_executed_per_opcode (warp-level instructions,
# one launch), sorted, with each opcode's count per element of the S = Q Kᵀ products the launch
# computed (B * H * Sq * Skv at the bench's dense shapes; pass ELEMENTS for another count).
#   KERNEL (regex, required), SEQ (default 16384), NAME (output tag), FVATTN_EXPERIMENT passes
#   through to pick a variant while an A/B switch exists.
set -uo pipefail
B=${BUILD_DIR:-build-gpu}
OUT=${OUT:-/tmp}
seq=${SEQ:-16384}
tag=${NAME:-mix}
ncu --clock-control none --kernel-name "regex:${KERNEL:?KERNEL regex}" --launch-count 1 \
  --metrics sass__inst_executed_per_opcode --print-metric-instances values --csv --page raw \
  --log-file "$OUT/opcodes-$tag.csv" \
  "$B/tools/fvattn" bench --seq "$seq" --iters 1 --warmup 1 --no-sdpa > "$OUT/opcodes-$tag.err" 2>&1
python3 - "$OUT/opcodes-$tag.csv" "${ELEMENTS:-$((8 * seq * seq))}" "$tag" <<'PY'
import csv, sys
path, elements, tag = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rows = [r for r in csv.reader(open(path)) if r and not r[0].startswith("==")]
hdr = rows[0]
col = [i for i, k in enumerate(hdr) if k.startswith("sass__inst_executed_per_opcode")]
if not col or len(rows) < 3:
    sys.exit(f"{tag}: no opcode counts in {path}")
# Instanced values: "OPCODE1;OPCODE2;..." names and "n1;n2;..." counts, or "OP=n" pairs.
cell = rows[2][col[0]]
pairs = []
for item in cell.replace(",", ";").split(";"):
    item = item.strip()
    if "=" in item:
        k, v = item.split("=", 1)
        pairs.append((k.strip(), float(v.replace(" ", ""))))
if not pairs:
    print(f"{tag}: unparsed cell: {cell[:400]}")
    sys.exit(0)
pairs.sort(key=lambda kv: -kv[1])
total = sum(v for _, v in pairs)
# Warp instructions x 32 threads / elements = thread instructions per score element.
print(f"== {tag}: {total:.3e} warp instructions, {32 * total / elements:.2f} per element")
for k, v in pairs[:24]:
    print(f"{k:<16}{v:>14.0f}{32 * v / elements:>8.2f}")
PY
