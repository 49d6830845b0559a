#!/usr/bin/env bash
# tools/dev.sh test must not end on a green "100% tests passed" while tests were skipped: it runs
# tools/test_summary.sh after ctest, which names each skipped test, its reason and the command that
# enables it. Checked here on a fake ctest run (ctest_output.txt, LastTest.log: a fresh machine
# without pytest, ml_dtypes, jax, valgrind or a GPU) and on a run that skipped nothing.
# usage: check_test_summary.sh <source dir>
set -euo pipefail
src=$1; here="$src/tests/test_summary"; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*"; echo "--- summary was:"; cat "$tmp/summary" 2>/dev/null; exit 1; }

# dev.sh test runs the summary after ctest.
awk '/^  test\)/,/;;/' "$src/tools/dev.sh" | grep -q 'tools/test_summary.sh' \
  || fail "tools/dev.sh test does not run tools/test_summary.sh after ctest"

"$src/tools/test_summary.sh" "$here/ctest_output.txt" "$here/LastTest.log" build > "$tmp/summary"
cat "$tmp/summary"
expect() { grep -qF -- "$1" "$tmp/summary" || fail "missing: $1"; }
expect "4 test(s) did not run"
expect "python_numpy: skipped: /usr/bin/python3 lacks: Python module pytest, Python module ml_dtypes"
expect "to run it: /usr/bin/python3 -m pip install pytest ml_dtypes"
expect "python_jax: skipped: /usr/bin/python3 lacks:"
expect "/usr/bin/python3 -m pip install pytest ml_dtypes jax, then tools/dev.sh test again"
expect "c99_consumer_valgrind: skipped: valgrind not installed"
expect "to run it: sudo apt-get install valgrind"
expect "test_gpu_ops: skipped: no usable GPU"
expect "NVIDIA GPU"
# Tests that ran are not listed.
if grep -q "test_api_contract\|header_cffi_parse" "$tmp/summary"; then fail "lists a test that ran"; fi

# A run without skips says so.
grep -v "did not run\|(Skipped)" "$here/ctest_output.txt" > "$tmp/clean.txt"
"$src/tools/test_summary.sh" "$tmp/clean.txt" "$here/LastTest.log" build > "$tmp/summary"
expect "test summary: no test was skipped"
echo "test summary: OK"
