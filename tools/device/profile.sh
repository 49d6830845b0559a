#!/usr/bin/env bash
# ncu profile of the attention kernels at the bench shape (B=1, H=8, S=16384, D=128), on the device
# machine after tools/gpu-check has built build-gpu. Prints, per kernel, the time and the counters
# that say what bounds it: the SMs' busy cycles (mean, busiest) against the span, tensor-pipe (the
# hmma counter: it also counts wgmma on sm_90), shared-memory and issue utilization, L2 and DRAM
# throughput, warp instructions, occupancy, bank conflicts, and the main warp stall reasons.
# Clocks are left alone (--clock-control none).
#   KERNELS (regex, default all fvattn attention kernels), SEQ (default 16384), BENCH_EXTRA (more
#   `fvattn bench` options, e.g. "--ops vsa --lists local").
set -uo pipefail
mkdir -p "${OUT:-/tmp}"
B=${BUILD_DIR:-build-gpu}
m=gpu__time_duration.sum
m+=,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
m+=,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed
m+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
m+=,sm__issue_active.avg.pct_of_peak_sustained_active
m+=,sm__warps_active.avg.pct_of_peak_sustained_active
m+=,launch__registers_per_thread
m+=,lts__throughput.avg.pct_of_peak_sustained_elapsed
m+=,dram__throughput.avg.pct_of_peak_sustained_elapsed
m+=,smsp__inst_executed.sum
m+=,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
m+=,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio
m+=,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio
m+=,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
m+=,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
m+=,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio
m+=,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio
m+=,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio
m+=,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio
# The SMs' busy cycles, mean and busiest, against the kernel's span: how much of the span the SMs
# idle on average (an uneven last wave, blocks of uneven length).
m+=,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max
# Per-pipe instruction rates (which ALU pipe an ALU-bound kernel saturates), and the L2's hit rate
# on reads (how much of what the kernel reads comes from the DRAM), where this ncu has them.
metrics=$(ncu --query-metrics 2>/dev/null)
for pipe in alu fma fmaheavy fp16 xu lsu; do
  grep -q "^sm__inst_executed_pipe_${pipe} " <<< "$metrics" && m+=,sm__inst_executed_pipe_${pipe}.avg.pct_of_peak_sustained_active
done
grep -q "^lts__t_sector_op_read_hit_rate " <<< "$metrics" && m+=,lts__t_sector_op_read_hit_rate.pct
ncu --clock-control none --kernel-name "regex:${KERNELS:-fva_(sm90_)?(qat|vsa)_(fwd|bwd)}" --launch-skip 0 --launch-count ${COUNT:-6} \
  --metrics "$m" --csv --page raw --log-file "${OUT:-/tmp}/ncu.csv" \
  "$B/tools/fvattn" bench --seq "${SEQ:-16384}" --iters 1 --warmup 1 --no-sdpa --kernels "${BENCH_KERNELS:-auto}" ${BENCH_EXTRA:-} > "${OUT:-/tmp}/ncu.err" 2>&1
python3 - "${OUT:-/tmp}/ncu.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r and not r[0].startswith("==")]
hdr = rows[0]
short = {"gpu__time_duration.sum": "us", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor%",
         "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed": "smem%",
         "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": "bankconf",
         "sm__issue_active.avg.pct_of_peak_sustained_active": "issue%", "sm__warps_active.avg.pct_of_peak_sustained_active": "occ%",
         "launch__registers_per_thread": "regs",
         "lts__throughput.avg.pct_of_peak_sustained_elapsed": "L2%",
         "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram%",
         "lts__t_sector_op_read_hit_rate.pct": "L2rd_hit%",
         "smsp__inst_executed.sum": "warp_inst",
         "sm__cycles_active.avg": "smact_avg", "sm__cycles_active.max": "smact_max",
         "sm__cycles_elapsed.max": "span_cyc"}
for k in hdr:
    if k.startswith("sm__inst_executed_pipe_"):
        short[k] = "p_" + k.split("pipe_")[1].split(".")[0][:8]
    if "stalled_" in k:
        short[k] = "st_" + k.split("stalled_")[1].split("_per_issue")[0][:10]
cols = [i for i, k in enumerate(hdr) if k in short]
name_i = hdr.index("Kernel Name")
print("kernel".ljust(28) + " ".join(short[hdr[i]].rjust(10) for i in cols))
for r in rows[2:]:
    print(r[name_i][:28].ljust(28) + " ".join(r[i][:10].rjust(10) for i in cols))
PY
