#!/usr/bin/env bash
# The fvattn tool's command line: every command answers --help with its own usage
# and exit status 0 without running; an unknown option or command names what was given and the
# command to run for help, with exit status 2; `fvattn bench` on a machine without a GPU fails and
# says that there is no GPU (driver or device) and that bench needs one.
# Usage: check_cli.sh FVATTN CUDA_BUILD(ON|OFF)
set -u
fvattn=$1
cuda_build=${2:-OFF}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# run NAME ARGS...: runs fvattn ARGS, leaving $out/NAME.out, $out/NAME.err and $rc.
run() {
  local name=$1
  shift
  "$fvattn" "$@" > "$out/$name.out" 2> "$out/$name.err"
  rc=$?
}
expect_rc() {  # expect_rc NAME WANT DESCRIPTION
  if [ "$rc" -ne "$2" ]; then
    fail "$3: exit status $rc, want $2"
    sed 's/^/  stdout: /' "$out/$1.out" | head -n 20
    sed 's/^/  stderr: /' "$out/$1.err" | head -n 20
  fi
}
expect_in() {  # expect_in FILE PATTERN DESCRIPTION (extended regex)
  grep -Eq -- "$2" "$1" || { fail "$3: no match for '$2' in:"; sed 's/^/  | /' "$1" | head -n 20; }
}
expect_not_in() {
  if grep -Eq -- "$2" "$1"; then fail "$3: '$2' should not appear"; fi
}

for cmd in info demo bench soak version; do
  for h in --help -h; do
    run "$cmd-help" "$cmd" $h
    expect_rc "$cmd-help" 0 "fvattn $cmd $h"
    expect_in "$out/$cmd-help.out" "^Usage: fvattn $cmd( |$)" "fvattn $cmd $h: its own usage line"
  done
  run "$cmd-bogus" "$cmd" --no-such-option
  expect_rc "$cmd-bogus" 2 "fvattn $cmd --no-such-option"
  expect_in "$out/$cmd-bogus.err" "--no-such-option" "fvattn $cmd --no-such-option: names the option"
  expect_in "$out/$cmd-bogus.err" "fvattn $cmd --help" "fvattn $cmd --no-such-option: says what to run"
done
# --help runs nothing: info prints no dispatch table, demo no results.
expect_not_in "$out/info-help.out" "dispatch table" "fvattn info --help ran info"
expect_not_in "$out/demo-help.out" "PASS|FAIL|backend:" "fvattn demo --help ran the demo"
# Each usage lists its own options (bench keeps every option ab_table.py's runs and docs use).
for o in --seq --heads --seed --runs; do expect_in "$out/demo-help.out" "$o " "demo --help lists $o"; done
for o in --seq --batch --heads --dim --iters --warmup --density --json --no-sdpa --kernels \
         --deterministic --ds-budget-mib --lists --ops --qat-preset --settle --layer --topk --suite; do
  expect_in "$out/bench-help.out" "$o( |$)" "bench --help lists $o"
done
expect_not_in "$out/bench-help.out" "issue 5" "bench --help speaks of an issue"
for o in --minutes --threads --seed --check-every --max-seq --backend; do
  expect_in "$out/soak-help.out" "$o( |$)" "soak --help lists $o"
done
# The soak's own bookkeeping, on the CPU backend (a second CPU handle as the target): a few seconds
# of every op from two threads, every call checked.
run soak-cpu soak --backend cpu --minutes 0.1 --threads 2 --max-seq 128 --check-every 1 --seed 7
expect_rc soak-cpu 0 "fvattn soak --backend cpu"
expect_in "$out/soak-cpu.out" "^PASS$" "fvattn soak --backend cpu: PASS"

run top-help --help
expect_rc top-help 0 "fvattn --help"
for cmd in info demo bench soak version; do expect_in "$out/top-help.out" "^ +$cmd " "fvattn --help lists $cmd"; done
run none
expect_rc none 2 "fvattn without a command"
run unknown frobnicate
expect_rc unknown 2 "fvattn frobnicate"
expect_in "$out/unknown.err" "frobnicate" "fvattn frobnicate: names the command"
expect_in "$out/unknown.err" "fvattn --help" "fvattn frobnicate: says what to run"
run bad-value demo --runs zero
expect_rc bad-value 2 "fvattn demo --runs zero"
expect_in "$out/bad-value.err" "--runs" "fvattn demo --runs zero: names the option"
run bad-seq bench --seq 100
expect_rc bad-seq 2 "fvattn bench --seq 100"
expect_in "$out/bad-seq.err" "multiple" "fvattn bench --seq 100: says why"
run bad-suite bench --suite round9
expect_rc bad-suite 2 "fvattn bench --suite round9"
expect_in "$out/bad-suite.err" "round2" "fvattn bench --suite round9: names the suite there is"
run suite-layer bench --suite round2 --ops layer --layer 4,8,8
expect_rc suite-layer 2 "fvattn bench --suite round2 --ops layer"
expect_in "$out/suite-layer.err" "--suite" "fvattn bench --suite round2 --ops layer: says why"

# No GPU here (what `fvattn info` reports): bench fails, naming the missing driver/device and that
# it needs a GPU; info and demo's probe never reads as if the user had asked for CUDA.
run info info
expect_rc info 0 "fvattn info"
expect_not_in "$out/info.out" "FVA_BACKEND_CUDA requested" "fvattn info"
expect_in "$out/info.out" "vsa_layer" "fvattn info: the dispatch table's VSA layer row"
if grep -q "^GPU: no GPU found" "$out/info.out"; then
  run bench bench --no-sdpa
  [ "$rc" -ne 0 ] || fail "fvattn bench without a GPU: exit status 0"
  expect_in "$out/bench.err" "no GPU found \((no CUDA driver|.*no device|.*device)" \
    "fvattn bench without a GPU: names the missing driver or device"
  expect_in "$out/bench.err" "needs an NVIDIA GPU" "fvattn bench without a GPU: says bench needs one"
  expect_not_in "$out/bench.err" "driver version|FVA_BACKEND_CUDA requested" "fvattn bench without a GPU"
  expect_in "$out/info.out" "^  qat_forward +CPU .*reference" "fvattn info: the CPU backend's rows"
  expect_not_in "$out/info.out" "^ +CUDA " "fvattn info without a GPU: CUDA rows"
elif [ "$cuda_build" != ON ]; then
  run bench bench --no-sdpa
  [ "$rc" -ne 0 ] || fail "fvattn bench built without CUDA: exit status 0"
  expect_in "$out/bench.err" "without CUDA" "fvattn bench built without CUDA: says so"
else
  echo "a GPU is here: bench's no-GPU message not checked"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all fvattn command-line checks passed"
