#!/usr/bin/env bash
# Run ON THE GPU MACHINE (the device tool), from the repo root, with .device-deps carried
# (tools/device/prepare_deps.sh makes it). One call does everything the GPU can check today:
#   1. builds the library, tools and tests with the CUDA images (sm_90a, sm_100a, sm_120);
#   2. runs every test (the GPU ones included: NVFP4 parity, the CUDA backend frame);
#   3. runs the GPU parity test under compute-sanitizer (memcheck, racecheck), and memcheck over the
#      tests that run on every backend: wild VSA metadata (test_index_robustness) and one handle
#      shared by eight threads (test_thread_safety);
#   4. lists the SASS images in the CUDA binary with cuobjdump (sm_100a/sm_120 must be there too);
#   5. a probe of FastVideo's tile-mode divisions against the golden fakes (tile_division_probe.cu);
#   6. `fvattn info` and `fvattn demo` (the demo runs the CPU backend until CUDA kernels exist);
# and writes a short table last. Logs go to $OUT/all.log, the table to $OUT/summary.txt.
set -uo pipefail
OUT=${OUT:-/tmp/fvattn-device-out}
mkdir -p "$OUT"
root=$(pwd)
deps="$root/.device-deps/usr"
declare -a rows
step() {  # step NAME COMMAND...: run, log to $OUT/NAME.log, record PASS/FAIL
  local name=$1; shift
  local t0=$(date +%s)
  "$@" > "$OUT/step.log" 2>&1
  local rc=$?
  { echo "===== $name (rc $rc)"; cat "$OUT/step.log"; } >> "$OUT/all.log"
  rows+=("$(printf '%-22s %-5s %4ss  %s' "$name" "$([ $rc -eq 0 ] && echo PASS || echo FAIL)" $(( $(date +%s) - t0 )) "$(tail -n 1 "$OUT/step.log" | cut -c1-90)")")
  rm -f "$OUT/step.log"
  return $rc
}

nvidia-smi -L > "$OUT/gpu.txt"
step configure cmake -S . -B build-device -G Ninja -DFVATTN_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
  -Dfmt_DIR="$deps/lib/x86_64-linux-gnu/cmake/fmt" -Ddoctest_DIR="$deps/lib/cmake/doctest"
step build cmake --build build-device -j 16
step ctest ctest --test-dir build-device --output-on-failure -j 8
step sanitizer-memcheck compute-sanitizer --tool memcheck --error-exitcode 1 build-device/tests/nvfp4_device_parity
step sanitizer-racecheck compute-sanitizer --tool racecheck --error-exitcode 1 build-device/tests/nvfp4_device_parity
step memcheck-index compute-sanitizer --tool memcheck --error-exitcode 1 build-device/tests/test_index_robustness
step memcheck-threads compute-sanitizer --tool memcheck --error-exitcode 1 build-device/tests/test_thread_safety
step sass-images bash -c "cuobjdump --list-elf build-device/tests/nvfp4_device_parity | tee /dev/stderr | grep -c -E 'sm_(90a|100a|120)' | grep -qx 3 && echo 'SASS for sm_90a, sm_100a, sm_120'"
step tile-division-probe bash -c "nvcc -std=c++17 -O2 -arch=sm_90a -Ikernels -o build-device/tile_division_probe tools/device/tile_division_probe.cu && build-device/tile_division_probe tests/golden/qat/default_self_256"
step fvattn-info build-device/tools/fvattn info
step fvattn-demo build-device/tools/fvattn demo

{
  echo
  echo "== fvattn device check, $(date -u +%Y-%m-%dT%H:%MZ), commit ${FVA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}"
  cat "$OUT/gpu.txt"
  printf '%-22s %-5s %5s  %s\n' step result time "last line of log"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT/summary.txt"
