#!/usr/bin/env bash
# The wgmma guard (cmake/nvcc_wgmma_guard.sh) both ways: it passes a clean sm_90a compile of the
# probe, fails the probe built to make ptxas serialize its wgmma (naming the C751x message), and
# fails the probe built with a stack frame (local memory).
#   check_wgmma_guard.sh NVCC GUARD PROBE WORKDIR
set -uo pipefail
nvcc=$1 guard=$2 probe=$3 work=$4
mkdir -p "$work"
flags=(-gencode arch=compute_90a,code=sm_90a -cubin)
if ! "$guard" "$nvcc" "${flags[@]}" -o "$work/clean.cubin" "$probe" > "$work/clean.log" 2>&1; then
  echo "FAIL: the guard rejected the clean probe:"; cat "$work/clean.log"; exit 1
fi
if "$guard" "$nvcc" "${flags[@]}" -DFVA_GUARD_BAD -o "$work/bad.cubin" "$probe" > "$work/bad.log" 2>&1; then
  echo "FAIL: the guard passed the probe whose wgmma ptxas serializes:"; cat "$work/bad.log"; exit 1
fi
if ! grep -q '(C751[0-9])' "$work/bad.log"; then
  echo "FAIL: the bad probe failed, but not for a C751x serialization:"; cat "$work/bad.log"; exit 1
fi
if "$guard" "$nvcc" "${flags[@]}" -DFVA_GUARD_STACK -o "$work/stack.cubin" "$probe" > "$work/stack.log" 2>&1; then
  echo "FAIL: the guard passed the probe with a stack frame:"; cat "$work/stack.log"; exit 1
fi
if ! grep -q 'bytes stack frame' "$work/stack.log"; then
  echo "FAIL: the stack probe failed, but not for its stack frame:"; cat "$work/stack.log"; exit 1
fi
echo "PASS: clean probe accepted; serialized probe rejected ($(grep -o '(C751[0-9])' "$work/bad.log" | head -1)); stack-frame probe rejected"
