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
  --metrics sass__inst_executed_per_opcode --print-metric-instances details --csv --page raw \
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
# Instanced values. With `--print-metric-instances values` ncu prints "total (n; n; ...)", the
# counts without their opcodes; `details` adds the names, "total (NAME: n; ...)". Names and
# counts are split at the last ':' or '='; counts may carry thousands separators. A cell in any
# other form is printed raw below.
import re
cell = rows[2][col[0]]
inner = cell[cell.find("(") + 1:cell.rfind(")")] if "(" in cell else cell
pairs = []
for item in inner.split(";"):
    m = re.match(r"\s*(.+?)\s*[:=]\s*([0-9][0-9,.]*)\s*$", item)
    if m:
        pairs.append((m.group(1), float(m.group(2).replace(",", ""))))
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
