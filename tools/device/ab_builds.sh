#!/usr/bin/env bash
# A/B of two source trees in one device call, ON THE GPU MACHINE from the repo root, after
# `GPU_CHECK_STEPS=build tools/gpu-check` has built this checkout into build-gpu ("new"). The
# baseline ("base") is either this checkout with BASE_PATCH reversed (make it here with
# `git diff <base commit> -- kernels src > ab-base.patch`, left untracked so that the device tool
# carries it) or, with BASE_TREE, a whole source tree (make it here with `git archive <base commit>
# | tar -x -C .ab-base` in a folder .git/info/exclude ignores, and carry it: for a base the patch
# cannot express, files moved say), built beside it without tests or bindings. The benches then alternate, base first,
# ROUNDS times (default 2), on the same card in the same power state, and a table of TFLOPS (and
# the SM clock) per op and length comes last. Unlike tools/lab/experiments.sh, the variants
# need no runtime switch in the library.
#   BASE_PATCH or BASE_TREE (one is required), ROUNDS, BENCH_ARGS (default: --seq 16384,32768 --no-sdpa), OUT,
#   AB_BASE_DIR (where the base tree is built; default /tmp/fvattn-ab-base), NEW_ENVS (more
#   variants of the new build, each NAME=VAR=VALUE, space-separated, e.g.
#   "oneshot=FVATTN_EXPERIMENT=oneshot": benched in every round after "new", with VAR set),
#   AB_CMAKE_ARGS (more configure flags for the base, e.g. -DFVATTN_SASS_ARCHS=90a), AB_REUSE_BASE=1
#   (bench the base already built in AB_BASE_DIR by an earlier call on the same machine).
set -uo pipefail
OUT=${OUT:-/tmp/fvattn-ab}
mkdir -p "$OUT"
[ -n "${BASE_PATCH:-}${BASE_TREE:-}" ] || { echo "ab: BASE_PATCH or BASE_TREE is required"; exit 2; }
bench_args=${BENCH_ARGS:---seq 16384,32768 --no-sdpa}
base=${AB_BASE_DIR:-/tmp/fvattn-ab-base}  # the base tree and its build-gpu
deps="$(pwd)/.device-deps/usr"
if [ "${AB_REUSE_BASE:-0}" = 1 ] && [ -x "$base/build-gpu/tools/fvattn" ]; then
  echo "ab: reusing the base built in $base"
else
rm -rf "$base" && mkdir -p "$base"
if [ -n "${BASE_TREE:-}" ]; then
  tar -C "$BASE_TREE" --exclude=./build-gpu --exclude='./build-*' -cf - . | tar -C "$base" -xf -
  cp -r .device-deps "$base/" 2>/dev/null
else
  patch_file=$(realpath "$BASE_PATCH")
  tar --exclude=./build-gpu --exclude='./build-*' --exclude=./.git -cf - . | tar -C "$base" -xf -
  if ! (cd "$base" && patch -s -p1 -R < "$patch_file"); then
    echo "ab: $patch_file does not reverse onto this checkout"; exit 1
  fi
fi
if ! { cmake -S "$base" -B "$base/build-gpu" -G Ninja -DFVATTN_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
         -DFVATTN_BUILD_TESTS=OFF -DFVATTN_BINDINGS=OFF ${AB_CMAKE_ARGS:-} \
         -Dfmt_DIR="$deps/lib/x86_64-linux-gnu/cmake/fmt" -Ddoctest_DIR="$deps/lib/cmake/doctest" \
         -DCLI11_DIR="$deps/share/cmake/CLI11" -Dnlohmann_json_DIR="$deps/share/cmake/nlohmann_json" &&
       cmake --build "$base/build-gpu" -j "$(nproc)"; } > "$OUT/ab-base-build.log" 2>&1; then
  tail -n 20 "$OUT/ab-base-build.log"; echo "ab: the base did not build"; exit 1
fi
fi
variants="base new"
for e in ${NEW_ENVS:-}; do variants+=" ${e%%=*}"; done
for r in $(seq "${ROUNDS:-2}"); do
  for v in $variants; do
    bin=${GPU_CHECK_BUILD_DIR:-build-gpu}/tools/fvattn env=()
    [ $v = base ] && bin=$base/build-gpu/tools/fvattn
    for e in ${NEW_ENVS:-}; do [ "${e%%=*}" = "$v" ] && env=("${e#*=}"); done
    timeout 300 env "${env[@]}" "$bin" bench --json "$OUT/ab-$v-$r.json" $bench_args > "$OUT/ab-$v-$r.log" 2>&1 ||
      echo "ab: $v round $r failed (rc $?), see ab-$v-$r.log"
  done
done
python3 "$(dirname "$0")/ab_table.py" "$OUT" "${ROUNDS:-2}" $variants
