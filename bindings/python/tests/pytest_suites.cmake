# The pytest suites of the Python bindings, as CTest tests. Each runs against this build's
# libfvattn.so.1 (FVATTN_LIBRARY) and, where built, libfvattn_jax.so (FVATTN_JAX_LIBRARY), with the
# package imported from the source tree (PYTHONPATH).
set(_fva_py ${CMAKE_CURRENT_SOURCE_DIR}/python)
set(_fva_env
  "FVATTN_LIBRARY=$<TARGET_SONAME_FILE:fvattn>"
  "PYTHONPATH=${_fva_py}"
  "FVATTN_GOLDEN_DIR=${PROJECT_SOURCE_DIR}/tests/golden"
  "FVATTN_HEADER=${PROJECT_SOURCE_DIR}/include/fvattn/fvattn.h"
  "FVATTN_CC=${CMAKE_C_COMPILER}"
  # The CPU backend's threads: CTest runs suites side by side on CI's two cores.
  "FVATTN_NUM_THREADS=2"
  # These are the CPU suites: on a GPU machine JAX would otherwise default to its CUDA platform
  # (bindings/gpu_tests.sh runs the device suites).
  "JAX_PLATFORMS=cpu")
if(TARGET fvattn_jax)
  list(APPEND _fva_env "FVATTN_JAX_LIBRARY=$<TARGET_FILE:fvattn_jax>")
endif()

function(fvattn_pytest name requires)
  cmake_parse_arguments(P "" "REQUIRES_ENV" "FILES" ${ARGN})
  set(req_env)
  if(P_REQUIRES_ENV)
    set(req_env --requires-env ${P_REQUIRES_ENV})
  endif()
  add_test(NAME ${name}
           COMMAND ${Python3_EXECUTABLE} ${_fva_py}/tests/run_suite.py --requires ${requires} ${req_env}
                   -- ${P_FILES}
           WORKING_DIRECTORY ${_fva_py})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${_fva_env}" SKIP_RETURN_CODE 77)
endfunction()

fvattn_pytest(python_numpy numpy,pytest,ml_dtypes
  FILES tests/test_numpy_ops.py tests/test_errors.py tests/test_library_loading.py)
fvattn_pytest(python_vsa_layer numpy,pytest,ml_dtypes FILES tests/test_vsa_layer.py)
fvattn_pytest(python_golden numpy,pytest,ml_dtypes FILES tests/test_golden.py)
fvattn_pytest(python_cffi numpy,pytest,ml_dtypes,cffi FILES tests/test_cffi.py)
fvattn_pytest(python_package numpy,pytest,ml_dtypes,setuptools,wheel,pip FILES tests/test_package.py)
fvattn_pytest(python_jax numpy,pytest,ml_dtypes,jax REQUIRES_ENV FVATTN_JAX_LIBRARY
  FILES tests/test_jax.py tests/test_jax_vsa_layer.py)
# Sequence parallelism (fvattn.jax.parallel: Ulysses, ring attention) under jax.shard_map, and the
# ops under jax.jit with inputs sharded over batch and heads, on 8 host devices.
fvattn_pytest(python_jax_parallel numpy,pytest,ml_dtypes,jax REQUIRES_ENV FVATTN_JAX_LIBRARY
  FILES tests/test_jax_parallel.py tests/test_jax_ring.py tests/test_jax_sharding.py)
set_property(TEST python_jax_parallel APPEND PROPERTY ENVIRONMENT
  "XLA_FLAGS=--xla_force_host_platform_device_count=8")
# fvattn.torch on CPU tensors (the CPU backend): the autograd functions, the whole VSA layer, the
# tiling (tests/device/ holds them because bindings/gpu_tests.sh runs them on CUDA tensors too).
fvattn_pytest(python_torch numpy,pytest,ml_dtypes,torch
  FILES tests/device/test_torch.py tests/device/test_torch_vsa_layer.py)
# fvattn.torch's torch.library custom ops: torch.compile(fullgraph=True) with no graph break, compiled
# equal to eager, and torch.library.opcheck on every op.
fvattn_pytest(python_torch_compile numpy,pytest,ml_dtypes,torch FILES tests/test_torch_compile.py)
# Sequence parallelism in PyTorch (fvattn.torch.distributed: Ulysses, ring attention) on CPU
# tensors, over torch.distributed's gloo backend in 2 and 4 worker processes.
fvattn_pytest(python_torch_distributed numpy,pytest,ml_dtypes,torch FILES tests/test_torch_distributed.py)
# The README's examples (its torch example skips, saying so, where PyTorch is not installed).
fvattn_pytest(python_readme numpy,pytest,ml_dtypes,cffi,jax REQUIRES_ENV FVATTN_JAX_LIBRARY
  FILES tests/test_readme.py)
