#!/usr/bin/env bash
# Memory-side counters of chosen kernels (ncu, clocks left alone), ON THE GPU MACHINE after
# `GPU_CHECK_STEPS=build tools/gpu-check`: time, L2 hit rates (reads, writes), DRAM bytes and
# throughput, L2 throughput, tensor-pipe activity. For the questions profile.sh's issue-side
# counters leave open (is a kernel slower at one length because its loads miss L2?).
#   KERNELS (regex, required), SEQ (default 16384), COUNT (default 2), NAME (output tag);
#   the environment passes through to the bench (FVATTN_DS_BUDGET_MIB, FVATTN_EXPERIMENT).
set -uo pipefail
B=${BUILD_DIR:-build-gpu}
out=${OUT:-/tmp}/mem-${NAME:-probe}
m=gpu__time_duration.sum,lts__t_sector_hit_rate.pct,lts__t_sector_op_read_hit_rate.pct
m+=,lts__t_sector_op_write_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum
m+=,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed
m+=,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
ncu --clock-control none --kernel-name "regex:${KERNELS}" --launch-count "${COUNT:-2}" --metrics "$m" \
  --csv --page raw --log-file "$out.csv" \
  "$B/tools/fvattn" bench --seq "${SEQ:-16384}" --iters 1 --warmup 1 --no-sdpa --kernels auto \
  > "$out.err" 2>&1
python3 - "$out.csv" "${NAME:-probe}" "${SEQ:-16384}" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r and not r[0].startswith("==")]
if len(rows) < 3:
    print(f"{sys.argv[2]}: no ncu rows (see the .err log)"); sys.exit(0)
hdr, units, data = rows[0], rows[1], rows[2:]
def val(r, name):
    x = float(r[hdr.index(name)].replace(",", ""))
    u = units[hdr.index(name)]
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3, "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6,
             "Gbyte": 1e9}.get(u, 1)
    return x * scale
for r in data:
    name = r[hdr.index("Kernel Name")][:34]
    print(f"{sys.argv[2]:<12} S={sys.argv[3]:<6} {name:<34} {val(r, 'gpu__time_duration.sum'):>9.1f} us"
          f"  L2hit rd {val(r, 'lts__t_sector_op_read_hit_rate.pct'):5.1f}% wr {val(r, 'lts__t_sector_op_write_hit_rate.pct'):5.1f}%"
          f"  dram rd {val(r, 'dram__bytes_read.sum') / 2**30:6.3f} GiB wr {val(r, 'dram__bytes_write.sum') / 2**30:6.3f} GiB"
          f"  dram% {val(r, 'dram__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f}"
          f"  L2% {val(r, 'lts__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f}"
          f"  tensor% {val(r, 'sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'):5.1f}")
PY
