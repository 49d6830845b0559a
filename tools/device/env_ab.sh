#!/usr/bin/env bash
# A/B of runtime variants of ONE build, ON THE GPU MACHINE from the repo root: each variant is a set
# of environment variables (a temporary FVATTN_EXPERIMENT switch in the library's dispatch, or the
# environment default of a handle option, such as FVATTN_DS_BUDGET_MIB), benched alternately, base first, ROUNDS times, on
# the same card in the same power state; a table of TFLOPS and the SM clock per op and length comes
# last. Unlike tools/device/ab_builds.sh there is no second build (a minute less on the device);
# unlike tools/lab/experiments.sh there are no tests or sanitizers (run those on the variant
# separately, with the same variables).
#   VARIANTS (required): "name=VAR=VALUE,VAR=VALUE name2=..." (space-separated; a name alone, e.g.
#   "base", runs with nothing set); ROUNDS (default 2); BENCH_ARGS (default: --seq 16384,32768
#   --no-sdpa); BUILD_DIR (default build-gpu); OUT.
set -uo pipefail
OUT=${OUT:-/tmp/fvattn-env-ab}
mkdir -p "$OUT"
B=${BUILD_DIR:-build-gpu}
bench_args=${BENCH_ARGS:---seq 16384,32768 --no-sdpa}
names=()
for v in ${VARIANTS:?VARIANTS: name=VAR=VALUE,... per variant}; do names+=("${v%%=*}"); done
for r in $(seq "${ROUNDS:-2}"); do
  for v in $VARIANTS; do
    name=${v%%=*} env=()
    [ "$v" != "$name" ] && IFS=, read -r -a env <<< "${v#*=}"
    timeout 300 env "${env[@]}" "$B/tools/fvattn" bench --json "$OUT/ab-$name-$r.json" $bench_args \
      > "$OUT/ab-$name-$r.log" 2>&1 || echo "env_ab: $name round $r failed (rc $?), see ab-$name-$r.log"
  done
done
python3 "$(dirname "$0")/ab_table.py" "$OUT" "${ROUNDS:-2}" "${names[@]}"
