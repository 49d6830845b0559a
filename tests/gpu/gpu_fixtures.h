// What the GPU tests share: whether a usable CUDA device is there (and why not), CUDA handles,
// device mirrors of HostTensors (uploaded with their poison, downloaded for comparison), and device
// workspaces filled with 0xFF so a kernel that relies on zeroed scratch fails.
#pragma once

#include <cstdlib>
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <fvattn/fvattn.h>

#include <string>

#include "support/api_fixtures.h"
#include "support/host_tensor.h"

namespace fvt {

#define CUDA_OK(call)                                                                   \
  do {                                                                                  \
    const cudaError_t e_ = (call);                                                      \
    REQUIRE_MESSAGE(e_ == cudaSuccess, #call << " -> " << cudaGetErrorString(e_));      \
  } while (0)

// Empty when a CUDA handle can be created and the library has an image for the device; otherwise
// the reason the GPU tests skip.
std::string gpu_skip_reason();

// The kernels the GPU tests run: FVATTN_TEST_KERNELS=portable pins the portable kernels (CTest runs
// the suite both ways, so on sm_90 every test covers the native and the portable kernels).
inline int32_t test_kernels() {
  const char* k = std::getenv("FVATTN_TEST_KERNELS");
  return k != nullptr && std::string(k) == "portable" ? FVA_KERNELS_PORTABLE : FVA_KERNELS_AUTO;
}

struct CudaHandle {
  fva_handle_t h = nullptr;
  explicit CudaHandle(bool deterministic = false) {
    fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
    o.backend = FVA_BACKEND_CUDA;
    o.deterministic = deterministic ? 1 : 0;
    o.kernels = test_kernels();
    REQUIRE_OK(fva_create(&h, &o));
  }
  ~CudaHandle() { fva_destroy(h); }
  CudaHandle(const CudaHandle&) = delete;
  CudaHandle& operator=(const CudaHandle&) = delete;
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes, int fill_byte = 0xFF) : bytes_(bytes) {
    if (bytes) {
      CUDA_OK(cudaMalloc(&ptr_, bytes));
      CUDA_OK(cudaMemset(ptr_, fill_byte, bytes));
    }
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
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
    if (h.bytes()) CUDA_OK(cudaMemcpy(buf_.data(), h.data(), h.bytes(), cudaMemcpyHostToDevice));
  }
  // Into `h` (same shape and layout as the tensor this was made from).
  void download(HostTensor& h) const {
    CUDA_OK(cudaDeviceSynchronize());
    if (h.bytes()) CUDA_OK(cudaMemcpy(h.data(), buf_.data(), h.bytes(), cudaMemcpyDeviceToHost));
  }
  const fva_tensor_t* t() const { return &desc_; }

 private:
  DeviceBuffer buf_;
  fva_tensor_t desc_;
};

}  // namespace fvt
