"""Device tests (bindings/gpu_tests.sh runs them on the GPU machine): torch tensors, CuPy arrays and
JAX on CUDA. Each skips, with the reason, where its framework or a GPU is missing; a CUDA call the
library has no kernel for yet (FVA_ERR_UNSUPPORTED "no CUDA kernels yet") skips with that message."""
import pytest

import fvattn


def on_device(fn, *args, **kwargs):
    """fn(...), or a skip carrying the library's message when its CUDA backend lacks the kernel."""
    try:
        return fn(*args, **kwargs)
    except fvattn.Error as e:
        if e.status_name == "FVA_ERR_UNSUPPORTED" and "no CUDA kernels" in e.message:
            pytest.skip(f"library has no CUDA kernel for this yet: {e}")
        raise
