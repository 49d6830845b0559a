#!/usr/bin/env bash
# One device call for a kernel change, ON THE GPU MACHINE from the repo root (the device tool's
# working directory), with .device-deps carried:
#   1. builds this checkout (tools/gpu-check's build step, into build-gpu);
#   2. runs the GPU tests that TESTS names (a doctest -tc filter) and compute-sanitizer's
#      SANITIZERS on them in quick mode;
#   3. the A/B of tools/device/ab_builds.sh: this checkout ("new") against it with BASE_PATCH
#      reversed ("base"), ROUNDS rounds of `fvattn bench $BENCH_ARGS`, base first; or, with
#      VARIANTS instead of BASE_PATCH, tools/device/env_ab.sh's runtime variants of this one build
#      (no second build: a change behind an environment switch);
# and writes three files to $OUT, well under the device tool's eight: summary.txt (a line per step,
# then the A/B table, last), ab-all.json (every round's bench JSON: {"base": [...], "new": [...]})
# and logs.tar.gz (every log). A failed build or test skips the A/B: a change that fails its tests
# has no speed worth measuring.
#   BASE_PATCH (`git diff <base> -- kernels src > ab-base.patch` here, left untracked), BASE_TREE
#   (the base's whole source tree, tools/device/ab_builds.sh) or VARIANTS
#   (env_ab.sh's: "name=VAR=VALUE,... name2=...", the first the base),
#   TESTS (default: every GPU test), SANITIZERS (default: racecheck synccheck), ROUNDS (default 2),
#   BENCH_ARGS (default: --seq 16384,32768 --no-sdpa), OUT (default: /tmp/fvattn-ab-check),
#   KERNEL_TIMES (optional, a kernel-name regex: then each build's launches of those kernels are
#   timed by tools/device/kernel_times.sh at each of KERNEL_TIMES_SEQ (default 16384) after the
#   A/B, and summary.txt ends with the median per kernel of each), TIMELINE (optional, sequence lengths, e.g. "16384 32768": then
#   the VSA forward's timeline probe, tools/lab/vsa_fwd_timeline.cu, runs on both trees at those
#   lengths at 25% density, and on both again with their traced tiles' steps, -DFVA_TRACE_TILES
#   and TIMELINE_FLAGS (e.g. -DFVA_TRACED_FROM=29: other entries of the list); its output ends
#   summary.txt), LAYER (optional, the bench's layer shape, e.g. "--layer 8,30,52 --heads 12
#   --topk 26": then the VSA layer's GPU suite, test_gpu_vsa_layer, runs with the tests, natively
#   and with the portable kernels, and after the A/B the layer's bench alternates base and new
#   ROUNDS times; summary.txt gets each round's layer and fine-branch milliseconds and the layer
#   over its fine branch), LAYER_KERNEL_TIMES (optional, with LAYER: a kernel-name regex, e.g.
#   "layer|vsa_fwd"; each build's launches of those kernels during the layer's bench, timed by
#   tools/device/kernel_times.sh, end summary.txt, a line per launch), LAYER_TIMELINE (optional,
#   with LAYER: 1 runs tools/lab/layer_timeline.py on each build's library at the layer's grid,
#   heads and topk, and its kernel timelines end summary.txt), LAYER_SANITIZERS (optional, with
#   LAYER: compute-sanitizer tools, e.g. "memcheck racecheck", run over the layer's suite in quick
#   mode before the A/B; a failure skips it), LAYER_ALSO (optional, with LAYER: more layer shapes
#   separated by ';', e.g. "--layer 21,30,52 --heads 40 --topk 78": each benched once per build
#   after the rounds, base first, its layer rows in summary.txt).
set -uo pipefail
OUT=${OUT:-/tmp/fvattn-ab-check}
mkdir -p "$OUT"
work=$(mktemp -d)
tests=${TESTS:-*}
summary="$OUT/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
finish() {
  tar -C "$work" -czf "$OUT/logs.tar.gz" . 2> /dev/null
  exit "$1"
}
[ -n "${VARIANTS:-}${BASE_TREE:-}" ] || : "${BASE_PATCH:?BASE_PATCH (a patch from the base to this checkout), BASE_TREE (the base source tree) or VARIANTS}"

OUT="$work/build" GPU_CHECK_STEPS=build tools/gpu-check > "$work/build.log" 2>&1
if ! grep -q '^build  *PASS' "$work/build/summary.txt" 2> /dev/null; then
  note "build: FAIL (logs.tar.gz: build/all.log)"
  finish 1
fi
note "build: PASS"

B=${GPU_CHECK_BUILD_DIR:-build-gpu}  # tools/gpu-check's build directory
# suite LABEL LOG COMMAND...: runs a doctest suite (5 minutes at most), notes its counts, and ends
# the check when it fails.
suite() {
  local label=$1 log=$2
  shift 2
  if ! timeout 300 "$@" > "$log" 2>&1; then
    note "$label: FAIL: $(grep -E '^\[doctest\] (test cases|assertions)' "$log" | tr '\n' ' ')"
    finish 1
  fi
  note "$label: PASS: $(grep -E '^\[doctest\] test cases' "$log")"
}
suite "tests ($tests)" "$work/tests.log" $B/tests/test_gpu_ops -tc="$tests"
if [ -n "${LAYER:-}" ]; then
  for kernels in native portable; do
    suite "layer suite ($kernels)" "$work/layer-$kernels.log" \
      env FVATTN_TEST_KERNELS=$kernels $B/tests/test_gpu_vsa_layer
  done
  suite "layer suite (deterministic, no stored dS)" "$work/layer-deterministic.log" \
    env FVATTN_TEST_DETERMINISTIC=1 FVATTN_TEST_DS_BUDGET_MIB=0 $B/tests/test_gpu_vsa_layer
  for tool in ${LAYER_SANITIZERS:-}; do
    FVATTN_GPU_TEST_QUICK=1 timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 1 \
      --print-limit 20 $B/tests/test_gpu_vsa_layer > "$work/layer-sanitizer-$tool.log" 2>&1
    rc=$?
    note "compute-sanitizer $tool (layer suite): $([ $rc -eq 0 ] && echo PASS || echo "FAIL (rc $rc)"): $(tail -n 1 "$work/layer-sanitizer-$tool.log")"
    [ $rc -eq 0 ] || finish 1
  done
fi

failed=0
for tool in ${SANITIZERS:-racecheck synccheck}; do
  FVATTN_GPU_TEST_QUICK=1 timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 1 \
    --print-limit 20 $B/tests/test_gpu_ops -tc="$tests" > "$work/sanitizer-$tool.log" 2>&1
  rc=$?
  note "compute-sanitizer $tool: $([ $rc -eq 0 ] && echo PASS || echo "FAIL (rc $rc)"): $(tail -n 1 "$work/sanitizer-$tool.log")"
  [ $rc -eq 0 ] || failed=1
done
[ $failed -eq 0 ] || finish 1

base_dir=/tmp/fvattn-ab-base  # ab_builds.sh builds the base there (AB_BASE_DIR)
# Each variant: "name=VAR=VALUE,..." (its environment; the builds' "base" and "new" have none).
variants="base new"
if [ -n "${VARIANTS:-}" ]; then
  variants=$VARIANTS
  OUT="$work/ab" BUILD_DIR=$B tools/device/env_ab.sh > "$work/ab.log" 2>&1
else
  OUT="$work/ab" AB_BASE_DIR="$base_dir" tools/device/ab_builds.sh > "$work/ab.log" 2>&1
fi
names=()
for v in $variants; do names+=("${v%%=*}"); done
python3 - "$work/ab" "${ROUNDS:-2}" "$OUT/ab-all.json" "${names[@]}" <<'PY'
import json, os, sys
ab, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runs = {v: [] for v in sys.argv[4:]}
for r in range(1, rounds + 1):
    for v in runs:
        path = os.path.join(ab, f"ab-{v}-{r}.json")
        if os.path.exists(path):
            runs[v].append(json.load(open(path)))
json.dump(runs, open(out, "w"), indent=1)
PY
sed -n '/^op  /,$p' "$work/ab.log" | tee -a "$summary"
if [ -n "${KERNEL_TIMES:-}" ]; then
  for seq in ${KERNEL_TIMES_SEQ:-16384}; do
    files=()
    for v in $variants; do
      name=${v%%=*} env=()
      [ "$v" != "$name" ] && IFS=, read -r -a env <<< "${v#*=}"
      b=$B
      [ -z "${VARIANTS:-}" ] && [ "$name" = base ] && b=$base_dir/build-gpu
      env "${env[@]}" BUILD_DIR=$b KERNELS="$KERNEL_TIMES" SEQ=$seq OUT="$work/times-$name" \
        timeout 120 tools/device/kernel_times.sh > "$work/times-$name-$seq.txt" 2>&1
      files+=("$name=$work/times-$name-$seq.txt")
    done
    python3 - "$seq" "${files[@]}" <<'PY' | tee -a "$summary"
import re, statistics, sys
def medians(path):
    us = {}
    for line in open(path):
        m = re.match(r"S=\d+\s+(\S+)\s+([\d.]+) us", line)
        if m and m.group(1) != "sum":
            us.setdefault(m.group(1), []).append(float(m.group(2)))
    return {k: (statistics.median(v), len(v)) for k, v in us.items()}
runs = [(a.split("=", 1)[0], medians(a.split("=", 1)[1])) for a in sys.argv[2:]]
print(f"{'kernel (ncu, S=' + sys.argv[1] + ')':44s} " +
      " ".join(f"{name + ' us (launches)':>24s}" for name, _ in runs))
for k in sorted(set().union(*(set(d) for _, d in runs))):
    cell = lambda d: f"{d[k][0]:.1f} ({d[k][1]})" if k in d else "-"
    print(f"{k[:44]:44s} " + " ".join(f"{cell(d):>24s}" for _, d in runs))
PY
  done
fi
if [ -n "${LAYER:-}" ] && [ -z "${VARIANTS:-}" ]; then
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for name in base new; do
      b=$B
      [ "$name" = base ] && b=$base_dir/build-gpu
      # shellcheck disable=SC2086
      timeout 120 $b/tools/fvattn bench --ops layer $LAYER --no-sdpa --iters 20 --warmup 3 \
        --json "$work/layer-$name-$r.json" > "$work/layer-bench-$name-$r.log" 2>&1
    done
  done
  python3 - "$work" "${ROUNDS:-2}" <<'PY' | tee -a "$summary"
import json, os, sys
work, rounds = sys.argv[1], int(sys.argv[2])
ops = ["layer_forward", "layer_backward", "layer_fine_forward", "layer_fine_backward", "layer_over_fine"]
print(f"{'layer (ms; over fine: ratio), by round':40s} {'base':>24s} {'new':>24s}")
rows = {op: {"base": [], "new": []} for op in ops}
for r in range(1, rounds + 1):
    for name in ("base", "new"):
        path = os.path.join(work, f"layer-{name}-{r}.json")
        if not os.path.exists(path):
            continue
        for x in json.load(open(path))["results"]:
            if x["op"] in rows:
                rows[x["op"]][name].append(f"{x['ms']:.4g}")
for op in ops:
    print(f"{op:40s} {', '.join(rows[op]['base']):>24s} {', '.join(rows[op]['new']):>24s}")
PY
  IFS=';' read -r -a also <<< "${LAYER_ALSO:-}"
  for shape in "${also[@]}"; do
    [ -n "${shape// /}" ] || continue
    for name in base new; do
      b=$B
      [ "$name" = base ] && b=$base_dir/build-gpu
      note "== layer ($name): $shape"
      # shellcheck disable=SC2086
      timeout 180 $b/tools/fvattn bench --ops layer $shape --no-sdpa --iters 10 --warmup 2 2>&1 |
        grep -E '^(op |layer)' | tee -a "$summary"
    done
  done
  for name in base new; do
    b=$B
    [ "$name" = base ] && b=$base_dir/build-gpu
    if [ -n "${LAYER_KERNEL_TIMES:-}" ]; then
      note "== kernel times ($name, ncu, the layer's bench: $LAYER)"
      BUILD_DIR=$b KERNELS="$LAYER_KERNEL_TIMES" BENCH_ARGS="--ops layer $LAYER" SEQ=layer OUT="$work/ltimes-$name" \
        timeout 120 tools/device/kernel_times.sh 2>&1 | grep -v ' sum ' | tee -a "$summary"
    fi
    if [ -n "${LAYER_TIMELINE:-}" ]; then
      # --layer T,H,W --heads N --topk K: the same shape for the timeline's options (the bench's
      # defaults where LAYER leaves one out).
      # shellcheck disable=SC2086
      read -r grid heads topk < <(python3 -c "import sys; a = sys.argv[1:]; \
print(a[a.index('--layer') + 1], a[a.index('--heads') + 1] if '--heads' in a else 8, \
a[a.index('--topk') + 1] if '--topk' in a else 78)" $LAYER)
      note "== layer timeline ($name)"
      timeout 120 python3 tools/lab/layer_timeline.py --lib "$b/src/libfvattn.so.1" --grid "$grid" \
        --heads "$heads" --topk "$topk" 2>&1 | grep -v -i warn | tee -a "$summary"
    fi
  done
fi
if [ -n "${TIMELINE:-}" ]; then
  traced="-DFVA_TRACE_TILES ${TIMELINE_FLAGS:-}"
  for run in ".:" "$base_dir:" ".:$traced" "$base_dir:$traced"; do
    tree=${run%%:*} flags=${run#*:}
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a $flags -I "$tree/kernels" \
      -o "$work/timeline" tools/lab/vsa_fwd_timeline.cu -lcuda > "$work/timeline-build.log" 2>&1 ||
      { note "timeline probe: did not build against $tree"; continue; }
    for s in $TIMELINE; do
      note "== timeline: $([ "$tree" = . ] && echo new || echo base) $flags S=$s"
      timeout 120 "$work/timeline" "$s" 0.25 2>&1 | tee -a "$summary"
    done
  done
fi
finish 0
