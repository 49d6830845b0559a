#!/usr/bin/env bash
# A/B of experimental kernel variants in one device run, ON THE GPU MACHINE from the repo root,
# after `GPU_CHECK_STEPS=build tools/gpu-check` has built build-gpu. The variants are picked by a
# temporary switch that reads the environment variable FVATTN_EXPERIMENT in the CUDA backend's
# planner (src/cuda/), added for the A/B and removed once it is decided: outside an A/B the library
# has none. For the baseline and each
# variant, this script:
#   1. runs the GPU tests the variant touches (a doctest -tc filter);
#   2. benches it (`fvattn bench`, BENCH_ARGS, PyTorch SDPA alongside) into $OUT/ab-<name>.json;
# then, per variant, compute-sanitizer racecheck and synccheck (quick mode) on the same tests,
# and prints a table: the variant, its tests, its sanitizers and its TFLOPS per op and length.
# Every command runs under `timeout`, so a variant that hangs (a barrier protocol gone wrong)
# costs TIMEOUT seconds and a FAIL, not the whole run.
#   EXPERIMENTS="name=filter name=filter" (required: each variant and its doctest -tc filter, e.g.
#   "vsa-compact-dq=GPU*VSA*,GPU*golden*"; space-separated;
#   a filter may hold no spaces), SANITIZE=0 to skip the sanitizers.
set -uo pipefail
set -f  # the test filters hold globs for doctest, not for the shell
OUT=${OUT:-/tmp/fvattn-experiments}
mkdir -p "$OUT"
B=${BUILD_DIR:-build-gpu}
T=${TIMEOUT:-300}
bench_args=${BENCH_ARGS:---seq 16384,32768 --kernels auto}
declare -a rows
run_variant() {  # NAME FILTER: tests + bench with FVATTN_EXPERIMENT=NAME ("base": unset)
  local name=$1 filter=$2 env=()
  [ "$name" != base ] && env=(FVATTN_EXPERIMENT="$name")
  env "${env[@]}" timeout "$T" "$B/tests/test_gpu_ops" -tc="$filter" > "$OUT/ab-$name-test.log" 2>&1
  local test_rc=$?
  env "${env[@]}" timeout "$T" "$B/tools/fvattn" bench --json "$OUT/ab-$name.json" $bench_args \
    > "$OUT/ab-$name-bench.log" 2>&1
  local bench_rc=$?
  local san="-"
  if [ "$name" != base ] && [ "${SANITIZE:-1}" = 1 ]; then
    san=""
    for tool in racecheck synccheck; do
      env "${env[@]}" FVATTN_GPU_TEST_QUICK=1 timeout "$T" compute-sanitizer --tool $tool \
        --error-exitcode 1 --print-limit 10 "$B/tests/test_gpu_ops" -tc="$filter" \
        > "$OUT/ab-$name-$tool.log" 2>&1
      san+="$tool:$([ $? -eq 0 ] && echo ok || echo FAIL) "
    done
  fi
  rows+=("$(printf '%-24s tests:%-4s bench:%-4s %s' "$name" "$([ $test_rc -eq 0 ] && echo ok || echo FAIL)" \
    "$([ $bench_rc -eq 0 ] && echo ok || echo FAIL)" "$san")")
}
run_variant base "GPU*VSA*"
for e in ${EXPERIMENTS:-}; do
  run_variant "${e%%=*}" "${e#*=}"
done
{
  echo "== experiments, $(date -u +%Y-%m-%dT%H:%MZ), commit ${FVA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}"
  printf '%s\n' "${rows[@]}"
  # TFLOPS per op and length, one column per variant (bench JSON: rows of op, S, tflops).
  python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
runs = {}
for f in sorted(glob.glob(os.path.join(out, "ab-*.json"))):
    name = os.path.basename(f)[3:-5]
    try:
        data = json.load(open(f))
    except Exception as e:  # a variant whose bench failed
        print(f"{name}: no JSON ({e})")
        continue
    runs[name] = {(r["op"], r["S"]): r.get("tflops") for r in data.get("results", [])}
names = ["base"] + [n for n in runs if n != "base"]
names = [n for n in names if n in runs]
keys = sorted({k for r in runs.values() for k in r})
print(f"{'op':<22}{'S':>7}" + "".join(f"{n[:22]:>24}" for n in names))
for k in keys:
    cells = [runs[n].get(k) for n in names]
    print(f"{k[0]:<22}{k[1]:>7}" + "".join(f"{c:>24.1f}" if isinstance(c, (int, float)) else f"{'-':>24}" for c in cells))
PY
} | tee "$OUT/experiments.txt"
