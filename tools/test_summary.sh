#!/usr/bin/env bash
# After ctest: name every test that did not run and what enables it. CTest counts a skipped test
# (exit 77, SKIP_RETURN_CODE) as passed in "100% tests passed", and its reason shows only under
# ctest -V; this prints it, with the command that makes the test run.
# usage: test_summary.sh <ctest's console output> <LastTest.log> [build dir]
# Reads the "The following tests did not run:" list of the console output, and each such test's
# output in LastTest.log (every skip of this project prints a "SKIPPED: <reason>" line).
set -euo pipefail
console=$1; log=$2; build=${3:-build}

mapfile -t skipped < <(sed -n 's/^[[:space:]]*[0-9]\+ - \([^ ]\+\) (\(Skipped\|Disabled\|Not Run\))$/\1 \2/p' "$console")
if [ ${#skipped[@]} -eq 0 ]; then
  echo "test summary: no test was skipped"
  exit 0
fi

reason_of() {  # the SKIPPED: line of a test's output in LastTest.log (else its last output line)
  [ -f "$log" ] || return 0
  awk -v n="$1" '
    $2 == "Testing:" && $3 == n { on = 1; out = 0; next }
    on && /^Output:$/ { out = 1; getline; next }
    on && /^<end of output>$/ { exit }
    on && out && /^SKIPPED:/ { r = $0 }
    on && out && NF { last = $0 }
    END { print (r != "" ? r : last) }' "$log"
}

enable_hint() {  # what to run so that a test skipped for this reason runs
  local reason=$1 py mods=""
  case "$reason" in
    *" lacks: "*)
      py=${reason#SKIPPED: }; py=${py%% lacks: *}
      local m
      local hint=""
      # shellcheck disable=SC2013  # module names are single words
      for m in $(grep -o 'Python module [A-Za-z0-9_]\+' <<<"$reason" | sed 's/Python module //'); do
        if [ "$m" = pip ]; then hint="$py -m ensurepip (or apt-get install python3-pip), then "; else mods+=" $m"; fi
      done
      [ -n "$mods" ] && hint+="$py -m pip install$mods"
      hint=${hint%, then }
      case "$reason" in *FVATTN_JAX_LIBRARY*)
        hint+="${hint:+, then }tools/dev.sh test again (libfvattn_jax.so is built when CMake finds jax importable)";;
      esac
      echo "$hint";;
    *valgrind*) echo "sudo apt-get install valgrind";;
    *cffi*) echo "python3 -m pip install cffi";;
    *GPU*|*"CUDA device"*|*"CUDA driver"*) echo "run on a machine with an NVIDIA GPU and its driver";;
    *) echo "see ctest --test-dir $build -R '^$2\$' -V";;
  esac
}

echo "test summary: ${#skipped[@]} test(s) did not run (ctest counts a skip as passed):"
for entry in "${skipped[@]}"; do
  name=${entry%% *}; status=${entry#* }
  if [ "$status" = Skipped ]; then
    reason=$(reason_of "$name")
    echo "  $name: skipped: ${reason#SKIPPED: }"
    echo "      to run it: $(enable_hint "$reason" "$name")"
  else
    echo "  $name: $status"
    echo "      see ctest --test-dir $build -R '^$name\$' -V"
  fi
done
