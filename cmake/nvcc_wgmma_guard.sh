#!/usr/bin/env bash
# Runs an nvcc command (the sm90 family's compile, kernels/CMakeLists.txt, FVATTN_WERROR builds) with
# ptxas's verbose report and fails it when ptxas serialized wgmma instructions (C7510-C7519:
# "Potential Performance Loss: wgmma.mma_async instructions are serialized ..."). ptxas only
# reports these as info, and the kernels still run, just slower: a change that makes the register
# pressure or an accumulator access force the serialization must not land unnoticed. It fails a
# compile that gives a kernel a stack frame too (local memory: an array indexed at run time). The
# rest of the verbose report (registers, compile times) is dropped; everything else passes through.
set -uo pipefail
log=$(mktemp)
"$@" -Xptxas=-v 2> "$log"
rc=$?
grep -v -E '^ptxas info|^ +[0-9]+ bytes (stack frame|gmem)|^$' "$log" >&2
if grep -E '\(C751[0-9]\)' "$log" >&2; then
  echo "error: ptxas serialized wgmma instructions (above): the kernel pays a wait per product" >&2
  rc=1
fi
# A stack frame: an array the compiler indexes at run time lives in local memory (the QAT dK/dV's
# NVFP4 amaxes did, from a loop left rolled: 1.8 local loads and stores per score element).
if grep -E -B1 '^ +[1-9][0-9]* bytes stack frame' "$log" >&2; then
  echo "error: a kernel uses local memory (stack frame above): an array indexed at run time?" >&2
  rc=1
fi
rm -f "$log"
exit $rc
