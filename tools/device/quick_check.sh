#!/usr/bin/env bash
# The shortest useful device call, ON THE GPU MACHINE from a source tree's root with .device-deps
# beside it or inside: builds the library, tools and GPU tests for sm_90a only (GPU_CHECK_BUILD_DIR,
# default /tmp/fvattn-quick), runs the GPU suites (test_gpu_vsa_layer, then test_gpu_ops), a
# compute-sanitizer memcheck pass over the VSA layer's tests in quick mode, and `fvattn bench` at
# S = 16384 and 32768 without SDPA; each step under its own time limit (QUICK_LIMITS, seconds:
# build, layer tests, ops tests, memcheck, bench), so that the call returns what it reached;
# QUICK_STEPS (default "build layer ops memcheck bench") picks steps.
# Writes $OUT/quick.log and prints a line per step.
set -uo pipefail
OUT=${OUT:-/tmp/fvattn-quick-check}
mkdir -p "$OUT"
B=${GPU_CHECK_BUILD_DIR:-/tmp/fvattn-quick}
deps=$(pwd)/.device-deps/usr
[ -d "$deps" ] || deps=$(pwd)/../.device-deps/usr
read -r t_build t_layer t_ops t_mem t_bench <<< "${QUICK_LIMITS:-240 120 180 90 100}"
log=$OUT/quick.log
: > "$log"
step() {  # step NAME LIMIT COMMAND...
  local name=$1 limit=$2; shift 2
  [[ " ${QUICK_STEPS:-build layer ops memcheck bench} " == *" $name "* ]] || return 0
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/step.log" 2>&1
  local rc=$?
  { echo "===== $name (rc $rc)"; cat "$OUT/step.log"; } >> "$log"
  printf '%-12s %-5s %4ss  %s\n' "$name" "$([ $rc -eq 0 ] && echo PASS || echo "FAIL($rc)")" \
    $((SECONDS - t0)) "$(grep -E 'test cases|tests passed|ERROR SUMMARY' "$OUT/step.log" | tail -n 1 | cut -c1-90)"
}
step build "$t_build" bash -c "cmake -S . -B $B -G Ninja -DFVATTN_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
  -DFVATTN_SASS_ARCHS=90a -DFVATTN_BINDINGS=OFF -Dfmt_DIR=$deps/lib/x86_64-linux-gnu/cmake/fmt \
  -Ddoctest_DIR=$deps/lib/cmake/doctest -DCLI11_DIR=$deps/share/cmake/CLI11 \
  -Dnlohmann_json_DIR=$deps/share/cmake/nlohmann_json && cmake --build $B -j $(nproc)"
step layer "$t_layer" "$B/tests/test_gpu_vsa_layer"
step ops "$t_ops" "$B/tests/test_gpu_ops"
step memcheck "$t_mem" env FVATTN_GPU_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 1 \
  --print-limit 20 "$B/tests/test_gpu_vsa_layer"
step bench "$t_bench" "$B/tools/fvattn" bench --seq 16384,32768 --no-sdpa --json "$OUT/bench.json"
grep -A 20 '^op ' "$log" | head -n 14
