#!/usr/bin/env bash
# The k2q inverse's launches and Delta's beside them (ncu durations, tools/device/kernel_times.sh)
# in the VSA backward at S = 4096 and 16384 (B = 1, H = 8, 25%) and in the VSA layer's backward at
# 32 frames, for each build directory named on the command line, ON THE GPU MACHINE from the repo
# root: what the inverse costs on either side of its one-block limit (kern::invert_in_one_block).
#   tools/device/inverse_times.sh /tmp/fvattn-ab-base/build-gpu build-gpu
set -uo pipefail
for b in "$@"; do
  for shape in "4096:--seq 4096 --ops vsa" "16384:--seq 16384 --ops vsa" \
               "h12:--ops layer --layer 8,30,52 --heads 12 --topk 26"; do
    seq=${shape%%:*}
    OUT=$(mktemp -d) BUILD_DIR=$b SEQ=$seq KERNELS='vsa_invert|fva_delta' BENCH_ARGS="${shape#*:}" \
      timeout 120 tools/device/kernel_times.sh | sed "s|^|$(basename "$(dirname "$b")")/$(basename "$b") |"
  done
done
