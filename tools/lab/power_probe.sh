#!/usr/bin/env bash
# Clocks and power while `fvattn bench` runs, per op, ON THE GPU MACHINE after
# `GPU_CHECK_STEPS=build tools/gpu-check`: does a long op run below the boost clock (power or
# thermal capping), which ncu's one-kernel-at-a-time timings would not show? Prints the board's
# power limits, then per bench phase (the bench's progress lines, timestamped here) the SM clock
# and power drawn, median and min over nvidia-smi samples every 50 ms, and the throttle reasons
# seen. SEQ (default 32768), ITERS (default 100: phases long enough to sample).
set -uo pipefail
B=${BUILD_DIR:-build-gpu}
out=${OUT:-/tmp}
nvidia-smi -q -d POWER | grep -E "Power Limit|Power Draw" | sed 's/^ */  /'
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader,nounits -lms 50 > "$out/smi.csv" &
smi=$!
sleep 0.5
"$B/tools/fvattn" bench --seq "${SEQ:-32768}" --iters "${ITERS:-100}" --no-sdpa --kernels auto \
  2> >(while IFS= read -r line; do echo "$(date +%s.%N) $line"; done > "$out/phases.txt") \
  > "$out/power-bench.txt"
sleep 0.5
kill $smi
wait $smi 2>/dev/null
grep -E "^(qat|vsa)" "$out/power-bench.txt"
python3 - "$out/smi.csv" "$out/phases.txt" <<'PY'
import datetime, statistics, sys
samples = []
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(",")]
    try:
        t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        samples.append((t, float(f[1]), float(f[2]), float(f[3]), f[4]))
    except (ValueError, IndexError):
        pass
phases = []
for line in open(sys.argv[2]):
    t, _, text = line.partition(" ")
    if text.startswith("bench S="):
        phases.append((float(t), text.strip()))
phases.append((float("inf"), "end"))
# nvidia-smi prints local time; the phase stamps are epoch seconds: align on the first sample
# within a phase by assuming both clocks agree (same machine).
for (t0, name), (t1, _) in zip(phases, phases[1:]):
    s = [x for x in samples if t0 <= x[0] < t1]
    if not s:
        print(f"{name:<48} no samples"); continue
    clk = [x[1] for x in s]; pw = [x[2] for x in s]
    reasons = sorted({x[4] for x in s})
    print(f"{name:<48} {len(s):4d} samples  SM MHz median {statistics.median(clk):6.0f} min {min(clk):6.0f}"
          f"  W median {statistics.median(pw):5.0f} max {max(pw):5.0f}  temp {max(x[3] for x in s):.0f}C  reasons {' '.join(reasons)}")
PY
