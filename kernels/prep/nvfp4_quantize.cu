// NVFP4 fake quantization of token rows on the GPU (SPEC.md section 1): QAT's preparation of Q, K
// (optionally mean-subtracted: smooth_k) and V, and fva_nvfp4_fake_quantize. One warp per tile of
// `tile_tokens` tokens of one (b, h); the tile's 16-element groups (16 consecutive elements of a
// token along D) are dealt to the lanes in row-major order, so a warp reads and writes whole rows
// (coalesced), with 16-byte accesses (the API's checks make every group 16-byte aligned: data
// pointers and the strides of dimensions longer than 1 are multiples of 16 bytes). (Until 9dcfbb0 a lane walked one
// token's row element by element: 2-byte loads 32 rows apart, 142 us per 16384 x 8 x 128 tensor on
// the H200.) The arithmetic is the shared nvfp4.h, so the result is bitwise the CPU reference's.
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

// The 16 values of one group (a 16-byte aligned pointer to its first element).
template <typename T>
__device__ __forceinline__ void load_group(const typename T::Storage* src, const float* mean,
                                           float (&v)[kNvfp4GroupSize]) {
  const uint4 lo = *reinterpret_cast<const uint4*>(src);
  const uint4 hi = *reinterpret_cast<const uint4*>(src + 8);
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[2 * i] = T::low(w[i]);
    v[2 * i + 1] = T::high(w[i]);
  }
  // kk = k - mean, computed in fp32 and rounded to the dtype (what torch's bf16 subtraction gives).
  if (mean != nullptr) {
#pragma unroll
    for (int i = 0; i < kNvfp4GroupSize; ++i) v[i] = T::round(v[i] - mean[i]);
  }
}

template <typename T>
__device__ __forceinline__ void store_group(typename T::Storage* dst,
                                            const float (&v)[kNvfp4GroupSize]) {
  uint32_t w[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i] = T::pack(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  *reinterpret_cast<uint4*>(dst + 8) = make_uint4(w[4], w[5], w[6], w[7]);
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
  const int row_groups = p.D / kNvfp4GroupSize;
  const int groups = rows * row_groups;
  auto src = [&](int g) { return x + (s0 + g / row_groups) * p.x.stride_s + (g % row_groups) * 16; };
  auto dst = [&](int g) { return y + (s0 + g / row_groups) * p.y.stride_s + (g % row_groups) * 16; };
  auto mean = [&](int g) { return p.mean != nullptr ? p.mean + (g % row_groups) * 16 : nullptr; };

  float enc = 1.0f, dec = 1.0f;
  if (p.quantize && p.scale_mode == 1) {  // tile: one second-level scale over the tile's values
    float amax = 0.0f;
    for (int g = lane; g < groups; g += 32) {
      float v[kNvfp4GroupSize];
      load_group<T>(src(g), mean(g), v);
#pragma unroll
      for (int i = 0; i < kNvfp4GroupSize; ++i) amax = nvfp4_amax_step(amax, v[i]);
    }
    enc = nvfp4_second_level_enc(warp_max(amax));
    dec = 1.0f / enc;
  }
  // kBatch groups per lane are loaded before any is written: more loads in flight, and y may be x
  // (each group is read whole before it is written, and groups do not overlap).
  constexpr int kBatch = 4;
  for (int g0 = lane; g0 < groups; g0 += 32 * kBatch) {
    float v[kBatch][kNvfp4GroupSize];
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (g0 + 32 * k < groups) load_group<T>(src(g0 + 32 * k), mean(g0 + 32 * k), v[k]);
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (g0 + 32 * k >= groups) continue;
      if (p.quantize) {
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < kNvfp4GroupSize; ++i) amax = nvfp4_amax_step(amax, v[k][i]);
        const Nvfp4Group grp = nvfp4_group(amax, enc, dec);
#pragma unroll
        for (int i = 0; i < kNvfp4GroupSize; ++i) v[k][i] = nvfp4_fake_quant(grp, v[k][i]);
      }
      store_group<T>(dst(g0 + 32 * k), v[k]);
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
