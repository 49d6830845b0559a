#!/usr/bin/env bash
# One device call for a kernel change, ON THE GPU MACHINE from the repo root (carry .device-deps):
#   1. builds this checkout for sm_90a only (tools/gpu-check's build step);
#   2. the GPU tests named by TESTS (doctest -tc patterns; default: VSA, QAT, golden, backward);
#   3. compute-sanitizer (SANITIZERS, default memcheck racecheck synccheck) on SANITIZE_TESTS;
#   4. the A/B bench against this checkout with BASE_PATCH reversed (tools/device/ab_builds.sh;
#      ROUNDS, BENCH_ARGS as there);
#   5. the VSA forward timeline probe (tools/device/vsa_fwd_timeline.cu) built against both trees
#      at TIMELINE_SEQS (default 16384 32768), density 0.25, then this tree's with its traced
#      tiles' steps (-DFVA_TRACE_TILES);
# and tars everything into $OUT/results.tgz (the device tool brings back at most 8 files).
# BASE_PATCH: `git diff <base> -- kernels src > ab-base.patch` here, left untracked.
set -u
R=${OUT:?}/r
mkdir -p "$R"
tests=${TESTS:-"GPU VSA*,GPU QAT*,GPU results*,GPU backward*"}
sanitize_tests=${SANITIZE_TESTS:-"GPU VSA matches the CPU backend (ragged*,GPU QAT attention matches the CPU backend (random*"}
GPU_CHECK_STEPS=build GPU_CHECK_CMAKE_ARGS=-DFVATTN_SASS_ARCHS=90a OUT=$R/gc tools/gpu-check > /dev/null 2>&1
tail -n 3 "$R/gc/summary.txt"
build-gpu/tests/test_gpu_ops -tc="$tests" > "$R/tests.log" 2>&1
echo "tests rc $?: $(grep -E '^\[doctest\] (test cases|assertions)' "$R/tests.log" | tr '\n' ' ')"
for t in ${SANITIZERS:-memcheck racecheck synccheck}; do
  FVATTN_GPU_TEST_QUICK=1 compute-sanitizer --tool "$t" --error-exitcode 1 --print-limit 5 \
    build-gpu/tests/test_gpu_ops -tc="$sanitize_tests" > "$R/sanitize-$t.log" 2>&1
  echo "$t rc $?: $(tail -n 1 "$R/sanitize-$t.log")"
done
if [ -n "${BASE_PATCH:-}" ]; then
  AB_CMAKE_ARGS=-DFVATTN_SASS_ARCHS=90a OUT=$R/ab tools/device/ab_builds.sh > "$R/ab.log" 2>&1
  tail -n 30 "$R/ab.log"
fi
trees=.
[ -d /tmp/fvattn-ab-base/kernels ] && trees+=" /tmp/fvattn-ab-base"
# Each tree's blocks as they run, then this tree's with the traced tiles' steps (slower by the traces).
{
  for tree in $trees; do
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I "$tree/kernels" -o /tmp/vsa_tl \
      tools/device/vsa_fwd_timeline.cu -lcuda || continue
    for s in ${TIMELINE_SEQS:-16384 32768}; do echo "== $tree S=$s"; /tmp/vsa_tl "$s" 0.25; done
  done
  nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DFVA_TRACE_TILES -I kernels \
    -o /tmp/vsa_tl_tiles tools/device/vsa_fwd_timeline.cu -lcuda &&
    for s in ${TIMELINE_SEQS:-16384 32768}; do echo "== . S=$s, tiles traced"; /tmp/vsa_tl_tiles "$s" 0.25; done
} > "$R/timeline.txt" 2>&1
cat "$R/timeline.txt"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv > "$R/smi.txt" 2>&1
tar -C "$R" -czf "$OUT/results.tgz" . && rm -rf "$R"
