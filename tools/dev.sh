#!/usr/bin/env bash
# One-step set-up, build and run, for a fresh Debian/Ubuntu machine or CI.
#   tools/dev.sh demo   install missing build packages, build, run `fvattn demo` (the main job)
#   tools/dev.sh test   install missing build packages, build, run every test (ctest)
#   tools/dev.sh build  install missing build packages and build
# Environment: BUILD_DIR (default build), CMAKE_ARGS (extra configure flags, e.g. -DFVATTN_CUDA=OFF),
# JOBS (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-}
case "$what" in demo|test|build) ;; *) sed -n '2,8p' "$0"; exit 2 ;; esac

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
packages=(cmake g++ make pkg-config libfmt-dev doctest-dev binutils)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "dev.sh: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j "$jobs"

case "$what" in
  demo) "$build_dir/tools/fvattn" demo ;;
  test) ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" ;;
esac
