#!/usr/bin/env bash
# How much of a VSA backward kernel's time is per block and how much per listed pair, ON THE GPU
# MACHINE after `GPU_CHECK_STEPS=build tools/gpu-check` (or tools/device/quick_check.sh's build).
# The dK/dV kernel runs a block per kv block that walks that block's inverse list; the stored-dS dQ
# kernel a block per q block that walks its q2k list. At B = 1, H = 8, D = 128 and random lists,
# the bench's (S, density) pairs below give lists of 16, 32 and 64 entries at several grid sizes,
# so a block's time separates into a fixed part (launch, K/V or list reads before the first tile,
# the stores after the last) and a part per entry. For each kernel this times every launch
# (tools/device/kernel_times.sh: ncu, clocks left alone), takes the medians, and fits
#     time = waves x (fixed + entries x per_entry),   waves = blocks / resident slots,
# by least squares, then prints each configuration's time against the fit and the fixed part's
# share of the kernel at S = 4096 and at S = 16384: how much short lists pay per block, whatever
# that part is made of (docs/perf.md: a persistent dK/dV kernel, overlapping one item's stores with
# the next one's loads, did not recover it).
#   BUILD_DIR (default build-gpu), CONFIGS ("S:density ..."; default below), SMS (SM count;
#   default: asked of PyTorch, else 132), OUT (default /tmp). Runs from the repository root (it
#   reads the kernels' blocks per SM from kernels/shared/kernel_traits.h).
set -uo pipefail
B=${BUILD_DIR:-build-gpu}
OUT=${OUT:-/tmp}
mkdir -p "$OUT"
configs=${CONFIGS:-"4096:0.25 4096:0.5 8192:0.125 8192:0.25 16384:0.0625 16384:0.125 16384:0.25"}
sms=${SMS:-$(python3 -c 'import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)' 2> /dev/null || echo 132)}
rows=$OUT/list-length-fit.txt
: > "$rows"
for c in $configs; do
  S=${c%%:*} density=${c##*:}
  OUT=$OUT/fit-$S-$density BUILD_DIR=$B SEQ=$S KERNELS='vsa_bwd_dkdvs|vsa_bwd_dqs' \
    BENCH_ARGS="--seq $S --ops vsa --density $density" tools/device/kernel_times.sh |
    sed "s/^/$S $density /" >> "$rows"
done
python3 - "$rows" "$sms" kernels/shared/kernel_traits.h <<'PY'
import re, statistics, sys
rows, sms, traits = sys.argv[1], int(sys.argv[2]), open(sys.argv[3]).read()
H = 8
def per_sm(name):  # a kernel's resident blocks per SM, as shared/kernel_traits.h sets them
    return int(re.search(rf"constexpr int {name} = (\d+);", traits).group(1))
slots = {"dkdvs": per_sm("kSm90DkdvBlocksPerSm") * sms,
         "dqs": per_sm("kSm90DqFromDsBlocksPerSm") * sms}
times = {}
for line in open(rows):
    m = re.match(r"(\d+) ([\d.]+) S=\d+\s+fva_sm90_vsa_bwd_(dkdvs|dqs)_\S+\s+([\d.]+) us", line)
    if m:
        S, density, kernel, us = int(m.group(1)), float(m.group(2)), m.group(3), float(m.group(4))
        times.setdefault((kernel, S, density), []).append(us)
if not times:
    sys.exit("no kernel times (see the fit-*.err logs)")
for kernel in ("dkdvs", "dqs"):
    pts = []
    for (k, S, density), us in sorted(times.items()):
        if k != kernel:
            continue
        nb = S // 64
        entries = max(1, int(nb * density))  # the bench's top-k; dK/dV's inverse lists average the same
        waves = H * nb / slots[kernel]
        pts.append((S, density, entries, waves, statistics.median(us)))
    # time / waves = fixed + entries * per_entry: a line through (entries, time / waves).
    xs = [p[2] for p in pts]
    ys = [p[4] / p[3] for p in pts]
    n = len(pts)
    if n < 2 or len(set(xs)) < 2:
        print(f"{kernel}: too few list lengths to fit")
        continue
    mx, my = sum(xs) / n, sum(ys) / n
    per_entry = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    fixed = my - per_entry * mx
    print(f"{kernel}: per block {fixed:.2f} us fixed + {per_entry:.3f} us per entry "
          f"({slots[kernel]} resident blocks)")
    print(f"  {'S':>6} {'density':>8} {'entries':>7} {'waves':>6} {'us':>9} {'fit':>9} {'fixed share':>11}")
    for S, density, entries, waves, us in pts:
        fit = waves * (fixed + entries * per_entry)
        share = fixed / (fixed + entries * per_entry) if fixed + entries * per_entry > 0 else 0.0
        print(f"  {S:>6} {density:>8} {entries:>7} {waves:>6.2f} {us:>9.1f} {fit:>9.1f} {share:>10.0%}")
PY
