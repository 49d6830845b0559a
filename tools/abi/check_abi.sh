#!/usr/bin/env bash
# The ABI guard (README, "Reliability and ABI policy"). Builds the library alone with debug info
# (CPU backend, RelWithDebInfo: the same public ABI as the release build, which has no DWARF to read
# types from) in $BUILD_DIR (default build-abi), describes its public ABI with abidw and compares it
# with the committed baseline abi/libfvattn.abi.
#   tools/abi/check_abi.sh check   fail unless the ABI is unchanged or only gained functions/variables
#   tools/abi/check_abi.sh dump    rewrite abi/libfvattn.abi (a release that changed the ABI on purpose)
# abidw keeps only what the public header declares (--headers-dir, --drop-private-types,
# --exported-interfaces-only), so internal types and hidden symbols never enter the baseline.
#
# Exit status of abidiff is a bit set: 1 error, 2 usage error, 4 ABI change, 8 incompatible change.
# abidiff marks only removed symbols as incompatible (8); a struct whose fields move or change type
# is just a "change" (4). So `check` fails on 8, and on 4 unless every change is an addition: any
# removed or changed function or variable fails. Appending a field to a struct_size struct is allowed
# by the policy but is still reported as a change: refresh the baseline with `dump` in the same
# commit, where the reviewer sees it.
set -euo pipefail
cd "$(dirname "$0")/../.."
what=${1:-}
case "$what" in check|dump) ;; *) sed -n '2,9p' "$0"; exit 2 ;; esac
for tool in abidw abidiff; do
  command -v $tool >/dev/null || { echo "check_abi.sh: $tool not found (Debian package abigail-tools)"; exit 1; }
done
dir=${BUILD_DIR:-build-abi}
baseline=abi/libfvattn.abi

cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFVATTN_CUDA=OFF -DFVATTN_BUILD_TESTS=OFF \
  -DFVATTN_BUILD_TOOLS=OFF >/dev/null
cmake --build "$dir" --target fvattn -j "${JOBS:-$(nproc)}" >/dev/null
lib=$(readlink -f "$dir/src/libfvattn.so")
dump() {
  abidw --headers-dir include/fvattn --drop-private-types --exported-interfaces-only --no-corpus-path \
    --no-comp-dir-path --no-elf-needed --short-locs --type-id-style hash --out-file "$1" "$lib"
}

if [ "$what" = dump ]; then
  dump "$baseline"
  echo "wrote $baseline ($(grep -c '<function-decl' "$baseline") functions) from $lib"
  exit 0
fi

current="$dir/libfvattn.abi"
dump "$current"
set +e
report=$(abidiff "$baseline" "$current")
rc=$?
set -e
echo "$report"
if [ $((rc & 3)) -ne 0 ]; then echo "check_abi.sh: abidiff failed (exit $rc)"; exit 1; fi
if [ $((rc & 8)) -ne 0 ]; then
  echo "check_abi.sh: INCOMPATIBLE ABI change against $baseline (abidiff exit $rc)"; exit 1
fi
if [ $((rc & 4)) -ne 0 ]; then
  # Only additions may pass: every "N Removed" and "N Changed" count of the summaries must be 0.
  if echo "$report" | grep -E '(^|[^0-9])[1-9][0-9]* (Removed|Changed)' >/dev/null; then
    echo "check_abi.sh: the ABI changed against $baseline (abidiff exit $rc): a removed or changed"
    echo "  function, variable or type. Incompatible: bump FVA_ABI_VERSION (the SONAME), then refresh the"
    echo "  baseline with 'tools/abi/check_abi.sh dump'. Allowed by the policy (fields appended to a"
    echo "  struct_size struct): refresh the baseline in the same commit."
    exit 1
  fi
  echo "check_abi.sh: compatible additions only (abidiff exit $rc); refresh $baseline when releasing"
  exit 0
fi
echo "check_abi.sh: ABI unchanged against $baseline ($(grep -c '<function-decl' "$baseline") functions)"
