// `fvattn soak`'s CUDA target (tools/soak_target.h): device memory and non-blocking streams of the
// CUDA runtime, on the handle's device.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <stdexcept>

#include "soak_target.h"

namespace fvtool {
namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

class CudaTarget final : public SoakTarget {
 public:
  explicit CudaTarget(int device) { cuda_ok(cudaSetDevice(device), "cudaSetDevice"); }
  const char* name() const override { return "CUDA"; }
  int32_t backend() const override { return FVA_BACKEND_CUDA; }
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  void release(void* p) override { cudaFree(p); }
  void* new_stream() override {
    cudaStream_t s = nullptr;
    cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    return s;
  }
  void delete_stream(void* stream) override { cudaStreamDestroy(static_cast<cudaStream_t>(stream)); }
  void fill(void* dst, uint8_t byte, size_t n, void* stream) override {
    cuda_ok(cudaMemsetAsync(dst, byte, n, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
  }
  void upload(void* dst, const void* src, size_t n, void* stream) override {
    cuda_ok(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)),
            "cudaMemcpyAsync");
  }
  void download(void* dst, const void* src, size_t n, void* stream) override {
    cuda_ok(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)),
            "cudaMemcpyAsync");
    cuda_ok(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  }
  std::string sync(void* stream) override {
    const cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
    return e == cudaSuccess ? "" : cudaGetErrorString(e);
  }
  std::string sync_all() override {
    const cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess ? "" : cudaGetErrorString(e);
  }
  bool memory_in_use(double* used_mib, double* total_mib) override {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return false;
    *used_mib = static_cast<double>(total - free) / 1048576.0;
    *total_mib = static_cast<double>(total) / 1048576.0;
    return true;
  }
};

}  // namespace

std::unique_ptr<SoakTarget> make_cuda_target(int device) { return std::make_unique<CudaTarget>(device); }

}  // namespace fvtool
