#!/usr/bin/env bash
# The GPU under fire, in one device call, ON THE GPU MACHINE from a source tree's root with
# .device-deps beside it or inside: builds for sm_90a only (the library, the tool, the fault tests
# and the fuzz replay; GPU_CHECK_BUILD_DIR, default /tmp/fvattn-quick, as tools/device/quick_check.sh),
# then
#   faults     tests/gpu/test_gpu_faults (short workspace, a stream of another context, a destroyed
#              handle) and, in its own process, its freed-device-pointer case;
#   replay     the fuzz corpus (tests/fuzz/corpus and the directories in FIRE_INPUTS, e.g. what a
#              fresh CPU fuzz run found) on a CUDA handle against the CPU backend, the work budget
#              lifted so that the larger problems reach the kernels;
#   memcheck   the same replay (the fuzz target's own calls) under compute-sanitizer memcheck;
#   racecheck  a sample of 10 inputs under compute-sanitizer racecheck;
#   soak       `fvattn soak --minutes ${SOAK_MINUTES:-5}` (shortened to what is left of FIRE_BUDGET,
#              default 570 s, so that the call ends within 10 minutes);
# each step under its own `timeout`, a PASS/FAIL line per step as it ends, the summary table last.
# FIRE_STEPS (default "build faults faults-freed replay memcheck racecheck soak") picks steps. Writes
# $OUT/fire-check.log (every step's output) and $OUT/soak.txt.
#   OUT=/tmp/out SOAK_MINUTES=5 tools/device/fire_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/fvattn-fire-check}
mkdir -p "$OUT"
B=${GPU_CHECK_BUILD_DIR:-/tmp/fvattn-quick}
budget=${FIRE_BUDGET:-570}
deps=$(pwd)/.device-deps/usr
[ -d "$deps" ] || deps=$(pwd)/../.device-deps/usr
read -r -a extra <<< "${FIRE_INPUTS:-}"
inputs=(tests/fuzz/corpus "${extra[@]}")
log=$OUT/fire-check.log
: > "$log"
rows=()
want() { [[ " ${FIRE_STEPS:-build faults faults-freed replay memcheck racecheck soak} " == *" $1 "* ]]; }
step() {  # step NAME LIMIT COMMAND...
  local name=$1 limit=$2; shift 2
  want "$name" || return 0
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/step.log" 2>&1
  local rc=$?
  { echo "===== $name (rc $rc)"; cat "$OUT/step.log"; } >> "$log"
  local verdict detail
  if [ $rc -eq 0 ]; then verdict=PASS; elif [ $rc -eq 124 ]; then verdict="FAIL(timeout)"; else verdict="FAIL($rc)"; fi
  detail=$(grep -E 'test cases|ERROR SUMMARY|^summary|failing inputs|^PASS$|^FAIL|mismatches|growth|TIMEOUT|SKIPPED' \
    "$OUT/step.log" | tail -n 2 | tr '\n' ' ' | cut -c1-110)
  rows+=("$(printf '%-10s %-14s %5ss  %s' "$name" "$verdict" $((SECONDS - t0)) "$detail")")
  printf '%-10s %-14s %5ss  %s\n' "$name" "$verdict" $((SECONDS - t0)) "$detail"
}
step build 200 bash -c "cmake -S . -B $B -G Ninja -DFVATTN_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
  -DFVATTN_SASS_ARCHS=90a -DFVATTN_BINDINGS=OFF -Dfmt_DIR=$deps/lib/x86_64-linux-gnu/cmake/fmt \
  -Ddoctest_DIR=$deps/lib/cmake/doctest -DCLI11_DIR=$deps/share/cmake/CLI11 \
  -Dnlohmann_json_DIR=$deps/share/cmake/nlohmann_json && \
  cmake --build $B -j $(nproc) --target fvattn_cli test_gpu_faults fvattn_fuzz_replay"
if [ ! -x "$B/tests/test_gpu_faults" ] || [ ! -x "$B/tests/fuzz/fvattn_fuzz_replay" ]; then
  tail -n 40 "$log"
  exit 1
fi
step faults 90 "$B/tests/test_gpu_faults" --test-case-exclude='*freed*'
step faults-freed 60 "$B/tests/test_gpu_faults" --test-case='*freed*'
step replay 90 "$B/tests/fuzz/fvattn_fuzz_replay" --target cuda --quiet --timeout 30 --work-budget 1e9 \
  "${inputs[@]}"
step memcheck 170 compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 \
  "$B/tests/fuzz/fvattn_fuzz_replay" --target cuda --quiet --timeout 90 "${inputs[@]}"
step racecheck 100 compute-sanitizer --tool racecheck --error-exitcode 1 --print-limit 20 \
  "$B/tests/fuzz/fvattn_fuzz_replay" --target cuda --every 4 --max-inputs 10 --timeout 60 tests/fuzz/corpus
if want soak; then
  left=$((budget - SECONDS - 40))
  minutes=$(awk -v m="${SOAK_MINUTES:-5}" -v left="$left" 'BEGIN { x = left / 60; if (x > m) x = m;
    if (x < 0.25) x = 0.25; printf "%.2f", x }')
  limit=$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 + 40 }')
  step soak "$limit" "$B/tools/fvattn" soak --minutes "$minutes"
  cp "$OUT/step.log" "$OUT/soak.txt"
fi
echo
echo "== fire check (soak ${minutes:-0} min; log $log)"
printf '%-10s %-14s %6s  %s\n' step verdict time detail
printf '%s\n' "${rows[@]}"
grep -qE "FAIL" <<< "$(printf '%s\n' "${rows[@]}")" && exit 1
exit 0
