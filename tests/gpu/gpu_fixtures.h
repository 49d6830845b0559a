// What the GPU tests share: whether a usable CUDA device is there (and why not), CUDA handles,
// device mirrors of HostTensors (uploaded with their poison, downloaded for comparison), and device
// workspaces filled with 0xFF so a kernel that relies on zeroed scratch fails.
//
// Device memory comes from support/cuda_memory.h, the driver-API allocator every other test uses
// (main() calls fvt::cuda::init_memory first): the memory is the primary context's, which cudart
// (the GPU tests' streams and graphs) and the library use as well. Its calls throw on failure
// instead of REQUIRE-ing, so these classes also serve on threads, where doctest's assertions may
// not be used; doctest reports an exception that leaves a test case as that case's failure.
#pragma once

#include <cstdlib>
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <fvattn/fvattn.h>

#include <string>

#include "support/api_fixtures.h"
#include "support/cuda_memory.h"
#include "support/host_tensor.h"

namespace fvt {

#define CUDA_OK(call)                                                                   \
  do {                                                                                  \
    const cudaError_t e_ = (call);                                                      \
    REQUIRE_MESSAGE(e_ == cudaSuccess, #call << " -> " << cudaGetErrorString(e_));      \
  } while (0)

// Empty when a CUDA handle can be created and the library has an image for the device, whose
// ordinal goes to *device; otherwise the reason the GPU tests skip.
std::string gpu_skip_reason(int* device);

// The kernels the GPU tests run: FVATTN_TEST_KERNELS=portable pins the portable kernels (CTest runs
// the suite both ways, so on sm_90 every test covers the native and the portable kernels).
inline int32_t test_kernels() {
  const char* k = std::getenv("FVATTN_TEST_KERNELS");
  return k != nullptr && std::string(k) == "portable" ? FVA_KERNELS_PORTABLE : FVA_KERNELS_AUTO;
}

// FVATTN_TEST_DETERMINISTIC=1 makes every test handle deterministic (CTest runs the suite that way
// too: on sm_90 the default handles reduce dQ inside the dK/dV kernel, deterministic ones run the
// dQ kernel, and both must match the CPU backend).
inline bool test_deterministic() {
  const char* d = std::getenv("FVATTN_TEST_DETERMINISTIC");
  return d != nullptr && std::string(d) == "1";
}

// Whether handle h runs the library's native sm_90a kernels where they apply (an sm_90a device,
// the default kernel set), so the paths only they have (the stored dS, the QAT forward's split and
// clusters, their handle options) are there to test.
inline bool runs_native_sm90(fva_handle_t h) {
  fva_handle_info_t info{};
  info.struct_size = sizeof info;
  REQUIRE_OK(fva_get_info(h, &info));
  return std::string(info.image) == "sm_90a" && test_kernels() == FVA_KERNELS_AUTO;
}

// FVATTN_TEST_DS_BUDGET_MIB sets every test handle's ds_budget_mib option (CTest runs the suite
// with 0 too: on sm_90 the other dQ paths then run); unset: the option's default.
inline int32_t test_ds_budget_mib() {
  const char* b = std::getenv("FVATTN_TEST_DS_BUDGET_MIB");
  return b != nullptr && *b ? static_cast<int32_t>(std::atoi(b)) : FVA_OPTION_AUTO;
}

// The options of a test's CUDA handle: the suite's kernel set, determinism and stored-dS budget.
inline fva_handle_options_t test_handle_options(bool deterministic = test_deterministic()) {
  fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = FVA_BACKEND_CUDA;
  o.deterministic = deterministic ? 1 : 0;
  o.kernels = test_kernels();
  o.ds_budget_mib = test_ds_budget_mib();
  return o;
}

struct CudaHandle {
  fva_handle_t h = nullptr;
  explicit CudaHandle(bool deterministic = test_deterministic())
      : CudaHandle(test_handle_options(deterministic)) {}
  explicit CudaHandle(const fva_handle_options_t& o) { REQUIRE_OK(fva_create(&h, &o)); }
  ~CudaHandle() { fva_destroy(h); }
  CudaHandle(const CudaHandle&) = delete;
  CudaHandle& operator=(const CudaHandle&) = delete;
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes, uint8_t fill_byte = 0xFF) : bytes_(bytes) {
    if (bytes) {
      ptr_ = cuda::alloc(bytes);
      try {
        cuda::fill(ptr_, fill_byte, bytes);
      } catch (...) {
        cuda::release(ptr_);  // the destructor does not run for a constructor that throws
        throw;
      }
    }
  }
  ~DeviceBuffer() { cuda::release(ptr_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A device copy of a HostTensor (same strides, padding bytes included), and its descriptor.
class DeviceTensor {
 public:
  explicit DeviceTensor(const HostTensor& h) : buf_(h.bytes()), desc_(h.desc()) {
    desc_.data = buf_.data();
    upload(h);
  }
  void upload(const HostTensor& h) {
    if (h.bytes()) cuda::copy_to_device(buf_.data(), h.data(), h.bytes());
  }
  // Into `h` (same shape and layout as the tensor this was made from), after all work on the device.
  void download(HostTensor& h) const {
    cuda::synchronize();
    if (h.bytes()) cuda::copy_to_host(h.data(), buf_.data(), h.bytes());
  }
  const fva_tensor_t* t() const { return &desc_; }

 private:
  DeviceBuffer buf_;
  fva_tensor_t desc_;
};

}  // namespace fvt
