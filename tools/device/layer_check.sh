#!/usr/bin/env bash
# One device call for a change to the whole VSA layer, ON THE GPU MACHINE from a source tree's root
# with .device-deps beside it or inside: builds for sm_90a only (tools/device/quick_check.sh's
# build), runs the layer's GPU suite under each handle configuration CTest runs it with (native,
# portable, no stored dS, deterministic), the fine VSA tests of test_gpu_ops, a memcheck pass over
# the layer's tests, every launch's duration at the small 32-frame shape (ncu) and the layer's own
# launches and the fine backward's at Wan's, `fvattn bench` of
# the layer at both of docs/perf.md's shapes, and, when FASTVIDEO names FastVideo's
# fastvideo-kernel/python folder, tools/bench_fastvideo_layer.py at both shapes. Each step under its
# own time limit; a line per step, the benches' tables last. Writes $OUT/layer-check.log (every
# step's output) and the benches' JSON, nothing else (the device tool brings back few files);
# scratch files go to $SCRATCH (default a fresh temporary folder).
#   FASTVIDEO=.fastvideo/fastvideo-kernel/python tools/device/layer_check.sh
#   LAYER_STEPS (default "tests jit memcheck demo times bench fastvideo") picks steps after the
#   build; "profile" (not a default) adds ncu's counters of the layer's own kernels at 32 frames
#   (tools/device/profile.sh: time, pipes, DRAM, occupancy, stall reasons); "jit" runs the
#   layer's suite, the NaN rule and the GPU suite (quick mode) through the PTX JIT
#   (FVATTN_PTX_JIT=1: the compute_80 PTX, the portable kernels), and `fvattn info` so.
set -uo pipefail
OUT=${OUT:-/tmp/fvattn-layer-check}
mkdir -p "$OUT"
S=${SCRATCH:-$(mktemp -d)}
mkdir -p "$S"
export GPU_CHECK_BUILD_DIR=${GPU_CHECK_BUILD_DIR:-/tmp/fvattn-quick}
B=$GPU_CHECK_BUILD_DIR
log=$OUT/layer-check.log
: > "$log"
want() { [[ " ${LAYER_STEPS:-tests jit memcheck demo times bench fastvideo} " == *" $1 "* ]]; }
step() {  # step NAME LIMIT COMMAND...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$S/step.log" 2>&1
  local rc=$?
  { echo "===== $name (rc $rc)"; cat "$S/step.log"; } >> "$log"
  printf '%-22s %-8s %4ss  %s\n' "$name" "$([ $rc -eq 0 ] && echo PASS || echo "FAIL($rc)")" \
    $((SECONDS - t0)) "$(grep -E 'test cases|ERROR SUMMARY|layer_over_fine|FAIL' "$S/step.log" | tail -n 1 | cut -c1-80)"
}
OUT=$S QUICK_STEPS=build tools/device/quick_check.sh | head -n 1
[ -x "$B/tests/test_gpu_vsa_layer" ] || { tail -n 40 "$S/quick.log"; exit 1; }
if want tests; then
  step "info" 30 "$B/tools/fvattn" info
  grep -E "image|why" "$S/step.log" | head -n 3
  step "layer (native)" 150 "$B/tests/test_gpu_vsa_layer"
  step "layer (portable)" 150 env FVATTN_TEST_KERNELS=portable "$B/tests/test_gpu_vsa_layer"
  step "layer (no stored dS)" 150 env FVATTN_TEST_DS_BUDGET_MIB=0 "$B/tests/test_gpu_vsa_layer"
  step "layer (deterministic)" 150 env FVATTN_TEST_DETERMINISTIC=1 FVATTN_TEST_DS_BUDGET_MIB=0 \
    "$B/tests/test_gpu_vsa_layer"
  step "ops: VSA" 150 "$B/tests/test_gpu_ops" -tc='*VSA*'
  step "nan rule" 60 "$B/tests/test_nan_rule"
  step "nan rule (portable)" 60 env FVATTN_TEST_KERNELS=portable "$B/tests/test_nan_rule"
fi
if want jit; then
  step "jit: info" 120 env FVATTN_PTX_JIT=1 "$B/tools/fvattn" info
  grep -E "image|why" "$S/step.log" | head -n 3
  step "jit: nan rule" 120 env FVATTN_PTX_JIT=1 "$B/tests/test_nan_rule"
  step "jit: layer" 150 env FVATTN_PTX_JIT=1 FVATTN_GPU_TEST_QUICK=1 "$B/tests/test_gpu_vsa_layer"
  step "jit: ops" 200 env FVATTN_PTX_JIT=1 FVATTN_GPU_TEST_QUICK=1 "$B/tests/test_gpu_ops"
fi
if want memcheck; then
  step "memcheck layer" 150 env FVATTN_GPU_TEST_QUICK=1 compute-sanitizer --tool memcheck \
    --error-exitcode 1 --print-limit 20 "$B/tests/test_gpu_vsa_layer"
fi
if want demo; then
  step "demo" 150 "$B/tools/fvattn" demo
  cp "$S/step.log" "$S/demo.txt"
fi
h12="--layer 8,30,52 --heads 12 --topk 26"
wan="--layer 21,30,52 --heads 40 --topk 78"
if want times; then
  step "kernel times h12" 120 env OUT="$S" BUILD_DIR="$B" KERNELS=fva SEQ=h12 \
    BENCH_ARGS="--ops layer $h12" tools/device/kernel_times.sh
  grep -E "^S=h12" "$S/step.log" | sed 's/^S=h12 *//' > "$S/times-h12.txt"
  step "kernel times wan" 150 env OUT="$S" BUILD_DIR="$B" KERNELS="fva_layer|vsa_bwd_dkdv|vsa_bwd_dq" SEQ=wan \
    BENCH_ARGS="--ops layer $wan" tools/device/kernel_times.sh
  grep -E "^S=wan" "$S/step.log" | sed 's/^S=wan *//' > "$S/times-wan.txt"
fi
if want profile; then  # not a default step: what bounds each of the layer's own kernels
  step "profile h12" 150 env OUT="$S" BUILD_DIR="$B" KERNELS="fva_layer" COUNT=10 \
    BENCH_EXTRA="--ops layer $h12" tools/device/profile.sh
  cp "$S/step.log" "$S/profile-h12.txt"
fi
if want bench; then
  # shellcheck disable=SC2086
  step "bench layer h12" 120 "$B/tools/fvattn" bench --ops layer $h12 --no-sdpa --iters 10 \
    --warmup 2 --json "$OUT/layer-h12.json"
  cp "$S/step.log" "$S/bench-h12.txt"
  # shellcheck disable=SC2086
  step "bench layer wan" 150 "$B/tools/fvattn" bench --ops layer $wan --no-sdpa --iters 10 \
    --warmup 2 --json "$OUT/layer-wan14b.json"
  cp "$S/step.log" "$S/bench-wan.txt"
fi
if want fastvideo && [ -n "${FASTVIDEO:-}" ]; then
  export FVATTN_LIBRARY=$B/src/libfvattn.so.1 PYTHONPATH=$PWD/bindings/python
  step "fastvideo h12" 120 python3 tools/bench_fastvideo_layer.py --fastvideo "$FASTVIDEO" \
    --grid 8,30,52 --heads 12 --topk 26 --json "$OUT/fastvideo-h12.json"
  cp "$S/step.log" "$S/fastvideo-h12.txt"
  step "fastvideo wan" 150 python3 tools/bench_fastvideo_layer.py --fastvideo "$FASTVIDEO" \
    --grid 21,30,52 --heads 40 --topk 78 --json "$OUT/fastvideo-wan14b.json"
  cp "$S/step.log" "$S/fastvideo-wan.txt"
fi
for f in demo.txt times-h12.txt times-wan.txt profile-h12.txt bench-h12.txt bench-wan.txt fastvideo-h12.txt fastvideo-wan.txt; do
  [ -f "$S/$f" ] || continue
  echo "== $f"
  grep -v -E "^bench layer|running|^\s*$" "$S/$f" | tail -n 70
done
