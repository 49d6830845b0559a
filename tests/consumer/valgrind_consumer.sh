#!/usr/bin/env bash
# valgrind memcheck over the C99 consumer (built by run_consumers.sh against the installed library):
# any invalid read or write, use of uninitialized memory or definite/indirect leak fails the test.
# usage: valgrind_consumer.sh <c99_consumer>. Exit 77 (skipped) when valgrind is not installed,
# unless FVATTN_REQUIRE_VALGRIND=1 (CI), which turns that into a failure.
set -euo pipefail
program="$1"
if ! command -v valgrind >/dev/null; then
  if [ "${FVATTN_REQUIRE_VALGRIND:-0}" = 1 ]; then echo "valgrind not found but FVATTN_REQUIRE_VALGRIND=1"; exit 1; fi
  echo "SKIPPED: valgrind not installed"
  exit 77
fi
# Two worker threads keep the CPU backend's parallel path in the run without making it slow.
FVATTN_NUM_THREADS=2 valgrind --tool=memcheck --error-exitcode=1 --leak-check=full \
  --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect \
  --track-origins=yes -q "$program"
echo "valgrind memcheck: clean"
