// Per-channel mean of K over (B, H, S) for QAT's smooth_k, in two deterministic steps (no atomics):
// each block sums one chunk of tokens of one (b, h) per channel in double, then one block adds the
// chunks in index order, divides and rounds to the dtype, as the CPU reference does.
#include "primitives/sm80.cuh"
#include "primitives/kernel_chain.cuh"
#include "shared/kernel_params.h"

namespace fva::dev {
namespace {

template <typename T>
__device__ __forceinline__ void mean_partial(const kern::MeanParams& p) {
  using E = typename T::Storage;
  const int chunks_per_bh = (p.S + p.chunk_tokens - 1) / p.chunk_tokens;
  const int chunk = blockIdx.x;
  const int bh = chunk / chunks_per_bh;
  const int b = bh / p.H, h = bh % p.H;
  const int s0 = (chunk % chunks_per_bh) * p.chunk_tokens;
  const int s1 = min(p.S, s0 + p.chunk_tokens);
  const E* x = static_cast<const E*>(p.x.data) + b * p.x.stride_b + h * p.x.stride_h;
  for (int d = threadIdx.x; d < p.D; d += blockDim.x) {
    double sum = 0.0;
    for (int s = s0; s < s1; ++s) sum += T::to_float(x[s * p.x.stride_s + d]);
    p.partial[static_cast<int64_t>(chunk) * p.D + d] = sum;
  }
}

template <typename T>
__device__ __forceinline__ void mean_final(const kern::MeanParams& p) {
  const double count = static_cast<double>(p.B) * p.H * p.S;
  for (int d = threadIdx.x; d < p.D; d += blockDim.x) {
    double total = 0.0;
    for (int c = 0; c < p.num_chunks; ++c) total += p.partial[static_cast<int64_t>(c) * p.D + d];
    p.mean[d] = T::round(static_cast<float>(total / count));
  }
}

}  // namespace
}  // namespace fva::dev

extern "C" __global__ void fva_k_mean_partial_bf16(const fva::kern::MeanParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
  fva::dev::mean_partial<fva::dev::Bf16>(p);
}
extern "C" __global__ void fva_k_mean_partial_f16(const fva::kern::MeanParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
  fva::dev::mean_partial<fva::dev::F16>(p);
}
extern "C" __global__ void fva_k_mean_final_bf16(const fva::kern::MeanParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
  fva::dev::mean_final<fva::dev::Bf16>(p);
}
extern "C" __global__ void fva_k_mean_final_f16(const fva::kern::MeanParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
  fva::dev::mean_final<fva::dev::F16>(p);
}
