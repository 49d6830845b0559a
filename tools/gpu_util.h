// What the GPU commands of the fvattn tool (bench, the GPU demo) share: device buffers through the
// CUDA runtime (the tool's own choice; libfvattn itself never links cudart), event timing, bf16
// fills, contiguous descriptors. Only built when FVATTN_CUDA=ON.
#pragma once

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <fvattn/fvattn.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "gpu_clocks.h"
#include "tensor_desc.h"

namespace fvtool {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    fmt::print(stderr, "fvattn: {} failed: {}\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

inline void fva_check(fva_status_t st, const char* what) {
  if (st != FVA_OK) {
    fmt::print(stderr, "fvattn: {} failed: {}: {}\n", what, fva_status_string(st), fva_last_error());
    std::exit(2);
  }
}

class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t bytes) : bytes_(bytes) {
    if (bytes) cuda_check(cudaMalloc(&p_, bytes), "cudaMalloc");
  }
  ~DeviceArray() {
    if (p_) cudaFree(p_);
  }
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  void upload(const std::vector<T>& v) {
    cuda_check(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  template <typename T>
  std::vector<T> download(size_t n) const {
    std::vector<T> v(n);
    cuda_check(cudaMemcpy(v.data(), p_, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return v;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Contiguous descriptors over device memory ([B, H, S, D], [B, H, S], ...): the helper the tests
// and the fuzzer use too.
using fvadesc::contiguous;

// Median time in ms of up to `iters` calls of fn on `stream`, each bracketed by events, after
// `warmup` untimed calls. fn(i) may rotate among input sets by i. Long calls are timed fewer times
// (at least 5) so that one op takes about `budget_ms` at most.
// With `clocks`, the timed calls (not the warm-up) run under its sampler and `stats` gets what it saw.
inline double median_ms(cudaStream_t stream, int warmup, int iters, const std::function<void(int)>& fn,
                        double budget_ms = 4000.0, ClockSampler* clocks = nullptr,
                        ClockStats* stats = nullptr) {
  cudaEvent_t a, b;
  cuda_check(cudaEventCreate(&a), "cudaEventCreate");
  cuda_check(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < warmup; ++i) {
    cuda_check(cudaEventRecord(a, stream), "cudaEventRecord");
    fn(i);
    cuda_check(cudaEventRecord(b, stream), "cudaEventRecord");
  }
  cuda_check(cudaStreamSynchronize(stream), "warm-up");
  float one = 0;
  if (warmup > 0) cuda_check(cudaEventElapsedTime(&one, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (one > 0) iters = std::max(std::min(iters, 5), std::min(iters, static_cast<int>(budget_ms / one)));
  std::vector<cudaEvent_t> ev(static_cast<size_t>(2 * iters));
  for (auto& e : ev) cuda_check(cudaEventCreate(&e), "cudaEventCreate");
  if (clocks != nullptr) clocks->start();
  for (int i = 0; i < iters; ++i) {
    cuda_check(cudaEventRecord(ev[2 * i], stream), "cudaEventRecord");
    fn(warmup + i);
    cuda_check(cudaEventRecord(ev[2 * i + 1], stream), "cudaEventRecord");
  }
  cuda_check(cudaStreamSynchronize(stream), "timed runs");
  if (clocks != nullptr) {
    const ClockStats seen = clocks->stop();
    if (stats != nullptr) *stats = seen;
  }
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]), "cudaEventElapsedTime");
    t.push_back(ms);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace fvtool
