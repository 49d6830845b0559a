#!/usr/bin/env bash
# Where one kernel's issue slots and stalls go, instruction by instruction, ON THE GPU MACHINE after
# tools/gpu-check has built build-gpu. ncu's SourceCounters section samples warp states per SASS
# instruction and counts each instruction's executions; this script profiles one launch of the
# kernel at the bench shape, writes the per-instruction table as CSV, and prints:
#   - executed warp instructions per opcode class (what the issue stream is made of), per warp and
#     per 64-key tile, so that counts compare across kernels and sizes;
#   - the instructions holding the most stall samples, with their stall reason mix;
#   - the kernel's phases between block-wide barriers: each one's share of the samples and of the
#     executed instructions.
# The SASS itself goes beside it (cuobjdump of every family's SASS fatbin, the kernel's function
# only).
#   KERNEL (regex, required), SEQ (default 16384), BENCH_ARGS (the bench's shape options instead
#   of `--seq SEQ`, e.g. "--ops layer --layer 8,30,52 --heads 12 --topk 26"), NAME (output tag),
#   TILES (warp-tiles the launch runs, for the per-tile column; default: the VSA forward's at 25%
#   density and SEQ: 8 heads x S/64 q blocks x S/256 kv blocks x 4 warps; with BENCH_ARGS give
#   TILES, or 1 for per-launch counts).
set -uo pipefail
B=${BUILD_DIR:-build-gpu}
OUT=${OUT:-/tmp}
mkdir -p "$OUT"
seq=${SEQ:-16384}
tag=${NAME:-hot}
ncu --clock-control none --kernel-name "regex:${KERNEL:?KERNEL regex}" --launch-count 1 \
  --section SourceCounters --section WarpStateStats --import-source no -f -o "$OUT/hot-$tag" \
  "$B/tools/fvattn" bench ${BENCH_ARGS:---seq $seq} --iters 1 --warmup 1 --no-sdpa > "$OUT/hot-$tag.err" 2>&1
ncu -i "$OUT/hot-$tag.ncu-rep" --page source --print-source sass --csv > "$OUT/hot-$tag-sass.csv" 2>>"$OUT/hot-$tag.err"
: > "$OUT/hot-$tag.sass"
for f in "$B"/kernels/fvattn_*.fatbin; do  # the SASS images (the _ptx ones hold no SASS)
  case $f in *_ptx.fatbin) continue ;; esac
  cuobjdump --dump-sass "$f" | awk -v k="${KERNEL}" '/Function :/ {on = ($0 ~ k)} on' >> "$OUT/hot-$tag.sass"
done
python3 - "$OUT/hot-$tag-sass.csv" "${TILES:-$((8 * (seq / 64) * (seq / 256) * 4))}" "$tag" <<'PY'
import csv, re, sys
from collections import defaultdict
path, tiles, tag = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rows = list(csv.reader(open(path)))
hdr_i = next((i for i, r in enumerate(rows) if "Source" in r and any("Executed" in c for c in r)), None)
if hdr_i is None:
    sys.exit(f"{tag}: no per-instruction table in {path} (first lines: {rows[:3]})")
hdr = rows[hdr_i]
src = hdr.index("Source")
ex = next(i for i, c in enumerate(hdr) if c.startswith("Instructions Executed"))
samp = next((i for i, c in enumerate(hdr) if c.startswith("Warp Stall Sampling (All")), None)
# Per-reason samples; ncu also prints each reason's "(Not Issued)" part, left out here.
stall_cols = [i for i, c in enumerate(hdr) if c.startswith("stall_") and "Not Issued" not in c]
def num(s):
    try: return float(s.replace(",", ""))
    except ValueError: return 0.0
by_op, samples_by_op = defaultdict(float), defaultdict(float)
insts = []
for r in rows[hdr_i + 1:]:
    if len(r) <= max(src, ex): continue
    text = r[src].strip()
    m = re.match(r"(@!?U?P\w+\s+)?([A-Z0-9_]+)(\.[A-Z0-9_.]+)?", text)
    if not m: continue
    op = m.group(2)
    n = num(r[ex])
    by_op[op] += n
    s = num(r[samp]) if samp is not None else 0.0
    samples_by_op[op] += s
    insts.append((s, n, text, r))
total = sum(by_op.values())
total_s = sum(samples_by_op.values()) or 1.0
print(f"== {tag}: {total:.4g} warp instructions, {total / tiles:.1f} per warp-tile ({tiles:.4g} warp-tiles)")
print("opcode".ljust(12) + "per tile".rjust(10) + "share".rjust(8) + "stall smp".rjust(11))
for op, n in sorted(by_op.items(), key=lambda kv: -kv[1])[:28]:
    print(op.ljust(12) + f"{n / tiles:10.1f}{100 * n / total:7.1f}%{100 * samples_by_op[op] / total_s:10.1f}%")
by_reason = defaultdict(float)
for _, _, _, r in insts:
    for i in stall_cols:
        by_reason[hdr[i][6:]] += num(r[i])
total_r = sum(by_reason.values()) or 1.0
# The HGMMA instructions' own samples carry none of the reasons this table lists (no gmma column).
print("-- stall reasons over the samples that carry one: " + ", ".join(
    f"{k} {100 * v / total_r:.1f}%" for k, v in sorted(by_reason.items(), key=lambda kv: -kv[1])[:8]))
print(f"-- top stall-sampled instructions (share of {total_s:.4g} samples; its two main reasons)")
for s, n, text, r in sorted(insts, key=lambda x: -x[0])[:24]:
    reasons = sorted(((num(r[i]), hdr[i][6:]) for i in stall_cols), reverse=True)[:2]
    why = ", ".join(f"{h[:14]} {100 * v / total_s:.1f}%" for v, h in reasons if v > 0)
    print(f"{100 * s / total_s:5.1f}%  x{n / tiles:6.2f}/tile  {text[:60]:60s} {why}")
# The kernel's phases: its SASS in address order, cut after each block-wide barrier (BAR.SYNC),
# which in these kernels separates the copies, the products and the row-wise passes; per phase its
# share of the samples and of the executed instructions, and the instructions that tell what it
# does (memory, tensor-core, shuffle, atomic, special-function).
print("-- phases between barriers, in address order (samples, executed instructions, what they hold)")
marks = ("HMMA", "HGMMA", "LDSM", "LDGSTS", "LDG", "STG", "LDS", "STS", "LD", "ST", "ATOMS", "RED",
         "SHFL", "VOTE", "MUFU", "UTMALDG", "SYNCS", "EXIT")
phase_s, phase_n, phase_ops, first = 0.0, 0.0, set(), 0
for idx, (s, n, text, _) in enumerate(insts + [(0.0, 0.0, "BAR.SYNC", None)]):
    op = re.sub(r"^@!?U?P\w+\s+", "", text).split(" ")[0].split(".")[0]
    phase_s, phase_n = phase_s + s, phase_n + n
    if op in marks: phase_ops.add(op)
    if text.startswith("BAR.SYNC") or idx == len(insts):
        if phase_n > 0:
            print(f"  insts {first:5d}-{idx:5d}  samples {100 * phase_s / total_s:5.1f}%  "
                  f"executed {100 * phase_n / (total or 1.0):5.1f}%  {' '.join(sorted(phase_ops))}")
        phase_s, phase_n, phase_ops, first = 0.0, 0.0, set(), idx + 1
PY
