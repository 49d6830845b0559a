#!/usr/bin/env bash
# Shared-memory bandwidth of chosen kernels (ncu, clocks left alone), ON THE GPU MACHINE after
# `GPU_CHECK_STEPS=build tools/gpu-check`: the L1/shared data banks' reads and writes as a share of
# their peak (wgmma's shared-memory operands and TMA writes pass through them, which the LSU
# wavefront counter of profile.sh does not see), beside tensor-pipe and issue activity. With
# SDPA=1 it also profiles PyTorch's cuDNN SDPA (forward and backward) at the same shape, the dense
# reference for what the banks carry at 600+ TFLOPS.
#   KERNELS (regex, default the VSA and QAT sm90 kernels), SEQ (default 16384), COUNT (default 8).
set -uo pipefail
B=${BUILD_DIR:-build-gpu}
out=${OUT:-/tmp}/smem
m=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
m+=,l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed
m+=,l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed
m+=,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed
m+=,sm__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second
summarize() {
  python3 - "$1" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r and not r[0].startswith("==")]
if len(rows) < 3:
    print(f"no ncu rows in {sys.argv[1]}"); sys.exit(0)
hdr, data = rows[0], rows[2:]
short = [("gpu__time_duration.sum", "time"), ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor%"),
         ("l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed", "bankrd%"),
         ("l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed", "bankwr%"),
         ("l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed", "lsu_sh%"),
         ("sm__issue_active.avg.pct_of_peak_sustained_active", "issue%"), ("sm__cycles_elapsed.avg.per_second", "clock")]
name_i = hdr.index("Kernel Name")
print("kernel".ljust(40) + "".join(s.rjust(10) for _, s in short))
for r in data:
    print(r[name_i][:40].ljust(40) + "".join(r[hdr.index(k)][:9].rjust(10) if k in hdr else "-".rjust(10) for k, _ in short))
PY
}
ncu --clock-control none --kernel-name "regex:${KERNELS:-fva_sm90_(vsa|qat)}" --launch-count "${COUNT:-8}" \
  --metrics "$m" --csv --page raw --log-file "$out.csv" \
  "$B/tools/fvattn" bench --seq "${SEQ:-16384}" --iters 1 --warmup 1 --no-sdpa --kernels auto \
  > "$out.err" 2>&1
summarize "$out.csv"
if [ "${SDPA:-0}" = 1 ]; then
  ncu --clock-control none --kernel-name "regex:${SDPA_KERNELS:-cudnn|sm90|flash|fmha}" --launch-skip 4 --launch-count 4 \
    --metrics "$m" --csv --page raw --log-file "$out-sdpa.csv" \
    python3 tools/bench_sdpa.py 1 8 128 "${SEQ:-16384}" > "$out-sdpa.err" 2>&1
  summarize "$out-sdpa.csv"
fi
