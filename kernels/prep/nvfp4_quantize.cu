// NVFP4 fake quantization of token rows on the GPU (SPEC.md section 1): QAT's preparation of Q, K
// (optionally mean-subtracted: smooth_k) and V, and fva_nvfp4_fake_quantize. One warp per tile of
// `tile_tokens` tokens of one (b, h); lane r handles tokens r, r + 32, ... of the tile. Groups are
// 16 consecutive elements of a token along D. The arithmetic is the shared nvfp4.h, so the result
// is bitwise the CPU reference's.
#include "common/device_primitives.cuh"
#include "common/kernel_params.h"
#include "common/nvfp4.h"

namespace fva::dev {
namespace {

template <typename T>
__device__ __forceinline__ float load_value(const typename T::Storage* row, int d, const float* mean) {
  const float x = T::to_float(row[d]);
  // kk = k - mean, computed in fp32 and rounded to the dtype (what torch's bf16 subtraction gives).
  return mean != nullptr ? T::round(x - mean[d]) : x;
}

template <typename T>
__device__ __forceinline__ void quantize_tiles(const kern::QuantizeParams& p) {
  using E = typename T::Storage;
  const int warps_per_block = blockDim.x / 32;
  const int64_t tiles_per_bh = (p.S + p.tile_tokens - 1) / p.tile_tokens;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / 32;
  if (tile >= static_cast<int64_t>(p.B) * p.H * tiles_per_bh) return;
  const int lane = threadIdx.x & 31;
  const int64_t bh = tile / tiles_per_bh;
  const int b = static_cast<int>(bh / p.H), h = static_cast<int>(bh % p.H);
  const int s0 = static_cast<int>((tile % tiles_per_bh) * p.tile_tokens);
  const int rows = min(p.tile_tokens, p.S - s0);
  const E* x = static_cast<const E*>(p.x.data) + b * p.x.stride_b + h * p.x.stride_h;
  E* y = static_cast<E*>(p.y.data) + b * p.y.stride_b + h * p.y.stride_h;

  float enc = 1.0f, dec = 1.0f;
  if (p.quantize && p.scale_mode == 1) {  // tile: one second-level scale over the tile's values
    float amax = 0.0f;
    for (int r = lane; r < rows; r += 32) {
      const E* row = x + (s0 + r) * p.x.stride_s;
      for (int d = 0; d < p.D; ++d) amax = nvfp4_amax_step(amax, load_value<T>(row, d, p.mean));
    }
    enc = nvfp4_second_level_enc(warp_max(amax));
    dec = 1.0f / enc;
  }
  for (int r = lane; r < rows; r += 32) {
    const E* row = x + (s0 + r) * p.x.stride_s;
    E* out = y + (s0 + r) * p.y.stride_s;
    for (int g0 = 0; g0 < p.D; g0 += kNvfp4GroupSize) {
      float v[kNvfp4GroupSize];
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < kNvfp4GroupSize; ++i) {
        v[i] = load_value<T>(row, g0 + i, p.mean);
        amax = nvfp4_amax_step(amax, v[i]);
      }
      if (p.quantize) {
        const Nvfp4Group grp = nvfp4_group(amax, enc, dec);
#pragma unroll
        for (int i = 0; i < kNvfp4GroupSize; ++i) v[i] = nvfp4_fake_quant(grp, v[i]);
      }
      // Whole group read before any of it is written: y may be x.
#pragma unroll
      for (int i = 0; i < kNvfp4GroupSize; i += 2) {
        const uint32_t packed = T::pack(v[i], v[i + 1]);
        *reinterpret_cast<uint32_t*>(out + g0 + i) = packed;
      }
    }
  }
}

}  // namespace
}  // namespace fva::dev

extern "C" __global__ void fva_nvfp4_quantize_bf16(const fva::kern::QuantizeParams p) {
  fva::dev::quantize_tiles<fva::dev::Bf16>(p);
}
extern "C" __global__ void fva_nvfp4_quantize_f16(const fva::kern::QuantizeParams p) {
  fva::dev::quantize_tiles<fva::dev::F16>(p);
}
