#!/usr/bin/env bash
# The Python and JAX bindings on the GPU machine, for tools/gpu-check (which builds first).
#   bindings/gpu_tests.sh [BUILD_DIR]     (default build-device; run from anywhere)
# Needs, preinstalled (the device has no network, so nothing is installed here): torch with CUDA,
# jax[cuda] (which brings ml_dtypes), numpy, pytest; cffi and CuPy are used when present.
# BUILD_DIR must hold libfvattn.so.1 and bindings/jax/libfvattn_jax.so (CMake builds the latter when
# the build's Python can import jax). Runs the CPU suites too (the same ones CTest runs), then the
# device suites: fvattn.torch against SDPA on CUDA, QAT on CUDA against the CPU backend, VSA, the
# caller's stream, CuPy, JAX on CUDA (values, grads, vmap, a jitted training step), one round of
# fvattn.torch.distributed over NCCL (a world of one) and the custom ops compiled on CUDA tensors.
# Exit status: pytest's (0 only if nothing failed). A test the GPU cannot run yet (the library has no
# CUDA kernel for it) is reported as skipped with the library's message; -rs lists every skip.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build-device}" && pwd) || { echo "gpu_tests.sh: no build directory ${1:-build-device}"; exit 2; }
export FVATTN_LIBRARY="$build/src/libfvattn.so.1"
export FVATTN_JAX_LIBRARY="$build/bindings/jax/libfvattn_jax.so"
export PYTHONPATH="$root/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
export FVATTN_GOLDEN_DIR="$root/tests/golden" FVATTN_HEADER="$root/include/fvattn/fvattn.h"
export FVATTN_CC=${CC:-cc}
for f in "$FVATTN_LIBRARY" "$FVATTN_JAX_LIBRARY"; do
  [ -f "$f" ] || { echo "gpu_tests.sh: $f is missing (was JAX importable when $build was configured?)"; exit 2; }
done
python3 - <<'PY'
import importlib
for name in ("numpy", "ml_dtypes", "pytest", "cffi", "torch", "jax", "cupy"):
    try:
        m = importlib.import_module(name)
        print(f"{name} {getattr(m, '__version__', '?')}", end="")
        if name == "torch":
            print(f", CUDA {m.cuda.is_available()}", end="")
        if name == "jax":
            print(f", devices {m.devices()}", end="")
        print()
    except Exception as e:  # noqa: BLE001 - a report, not a check
        print(f"{name}: not available ({type(e).__name__}: {e})")
PY
cd "$root/bindings/python"
suites=(tests/test_numpy_ops.py tests/test_errors.py tests/test_golden.py tests/test_jax.py
        tests/test_vsa_layer.py tests/test_jax_vsa_layer.py)
# The cffi suite and the README's examples (one of them is the cffi example) need cffi.
python3 -c "import cffi" 2>/dev/null && suites+=(tests/test_cffi.py tests/test_readme.py)
# The CPU suites with JAX on its CPU platform (they test the CPU backend, whose head dims the CUDA
# kernels do not all cover), then the device suites. JAX must not grab 75% of the GPU up front:
# torch and the library's workspaces share it.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
JAX_PLATFORMS=cpu python3 -m pytest -q -p no:cacheprovider -rs "${suites[@]}"
cpu_rc=$?
python3 -m pytest -q -p no:cacheprovider -rs tests/device
dev_rc=$?
exit $(( cpu_rc != 0 ? cpu_rc : dev_rc ))
