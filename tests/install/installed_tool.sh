#!/usr/bin/env bash
# `cmake --install` into a scratch prefix, then the installed `<prefix>/bin/fvattn version` must run
# as a user runs it (no LD_LIBRARY_PATH): the tool finds the installed libfvattn.so.1 through its
# install RPATH ($ORIGIN/../lib), and that copy, not the build tree's.
# usage: installed_tool.sh <build dir> <scratch prefix> <expected version>
set -euo pipefail
build_dir="$1"; prefix="$2"; version="$3"
rm -rf "$prefix"
cmake --install "$build_dir" --prefix "$prefix" >/dev/null
tool="$prefix/bin/fvattn"
[ -x "$tool" ] || { echo "FAILED: cmake --install left no executable $tool"; exit 1; }
unset LD_LIBRARY_PATH
if ! out=$("$tool" version 2>&1); then
  echo "FAILED: $tool version:"; echo "$out"; exit 1
fi
echo "$tool version: $out"
case "$out" in *"$version"*) ;; *) echo "FAILED: expected version $version in its output"; exit 1 ;; esac
if command -v ldd >/dev/null; then
  lib=$(ldd "$tool" | awk '/libfvattn\.so/ {print $3}')
  echo "libfvattn: $lib"
  case "$lib" in "$prefix"/*) ;; *) echo "FAILED: $tool loads libfvattn from $lib, not from $prefix"; exit 1 ;; esac
fi
rm -rf "$prefix"
