#!/usr/bin/env bash
# One-step set-up, build and run, for a fresh Debian/Ubuntu machine or CI.
#   tools/dev.sh demo   install missing build packages, build, run `fvattn demo` (the main job)
#   tools/dev.sh test   install missing build packages (and, where pip works, the Python packages
#                       the bindings' suites need), build, run every test (ctest), then name each
#                       test that was skipped and the command that makes it run
#   tools/dev.sh build  install missing build packages and build
# Environment: BUILD_DIR (default build), CMAKE_ARGS (extra configure flags, e.g. -DFVATTN_CUDA=OFF),
# JOBS (default: number of cores), FVATTN_NO_PIP=1 (test: leave Python packages as they are).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-}
case "$what" in demo|test|build) ;; *) sed -n '2,11p' "$0"; exit 2 ;; esac

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
packages=(cmake g++ make pkg-config libfmt-dev doctest-dev binutils libcli11-dev nlohmann-json3-dev)

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

# test: the Python packages the bindings' pytest suites need (the list .ci/run installs; jax before
# CMake runs, which builds libfvattn_jax.so only when jax imports), where pip can install them. A
# failed install is not fatal: the summary after ctest names each suite that could not run and why.
python_packages=(numpy ml_dtypes cffi pytest jax setuptools wheel torch)
if [ "$what" = test ] && [ "${FVATTN_NO_PIP:-0}" != 1 ] && command -v python3 >/dev/null; then
  py_missing=()
  for p in "${python_packages[@]}"; do
    python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$p') is None)" 2>/dev/null \
      || py_missing+=("$p")
  done
  if [ ${#py_missing[@]} -gt 0 ]; then
    if python3 -m pip --version >/dev/null 2>&1; then
      echo "dev.sh: installing Python packages ${py_missing[*]} (pip; FVATTN_NO_PIP=1 skips this)" >&2
      python3 -m pip install -q --disable-pip-version-check "${py_missing[@]}" \
        || echo "dev.sh: pip could not install ${py_missing[*]}; the suites that need them will be skipped" >&2
    else
      echo "dev.sh: no pip for python3, so ${py_missing[*]} stay missing; the suites that need them will be skipped" >&2
    fi
  fi
fi

# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j "$jobs"

case "$what" in
  demo) "$build_dir/tools/fvattn" demo ;;
  test)
    # ctest counts a skipped test as passed: the summary names each one and what enables it.
    rc=0
    ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" 2>&1 | tee "$build_dir/ctest-output.log" || rc=$?
    tools/test_summary.sh "$build_dir/ctest-output.log" "$build_dir/Testing/Temporary/LastTest.log" "$build_dir"
    exit "$rc" ;;
esac
