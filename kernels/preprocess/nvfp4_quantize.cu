// NVFP4 fake quantization of token rows on the GPU (SPEC.md section 1): QAT's preparation of Q, K
// (optionally mean-subtracted: smooth_k) and V in one launch, and fva_nvfp4_fake_quantize. One
// warp per tile of `tile_tokens` tokens of one (b, h) of one tensor (block mode, which has no tile
// of its own: a unit of kern::quantize_block_unit_tokens tokens); the tile's 16-element groups
// (16 consecutive elements of a token along D) are dealt to the lanes in row-major order, so a warp
// reads and writes whole rows (coalesced), with 16-byte accesses (the API's checks make every group
// 16-byte aligned: data pointers and the strides of dimensions longer than 1 are multiples of 16
// bytes). (A lane walking one token's row element by element would make 2-byte loads 32 rows
// apart.) The arithmetic is the shared nvfp4/nvfp4.h, so the result is bitwise the CPU
// reference's. For the sm_90a QAT forward, K's and V's copies are
// written in its owned-group key order (shared/key_order.h: rows permuted within 64-token tiles)
// and padded with zero rows to whole tiles (QuantizeJob::owned_order).
#include "primitives/sm80.cuh"
#include "primitives/kernel_chain.cuh"
#include "shared/kernel_params.h"
#include "shared/key_order.h"
#include "nvfp4/nvfp4.h"

namespace fva::dev {
namespace {

// One group's 16 elements as they sit in memory (a 16-byte aligned pointer to its first element).
struct RawGroup {
  uint4 lo, hi;
};
__device__ __forceinline__ RawGroup load_raw(const void* src) {
  const uint4* g = static_cast<const uint4*>(src);
  return RawGroup{g[0], g[1]};
}
// Its 16 values; kk = k - mean, computed in fp32 and rounded to the dtype (what torch's bf16
// subtraction gives), where a mean is given.
template <typename T>
__device__ __forceinline__ void unpack_group(const RawGroup& r, const float* mean,
                                             float (&v)[kNvfp4GroupSize]) {
  const uint32_t w[8] = {r.lo.x, r.lo.y, r.lo.z, r.lo.w, r.hi.x, r.hi.y, r.hi.z, r.hi.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[2 * i] = T::low(w[i]);
    v[2 * i + 1] = T::high(w[i]);
  }
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

// kD: the head dimension as a constant (block mode at D = 64 and 128, QAT's), so that a group's
// token and column come from shifts; 0 reads p.D (every other D, and tile mode).
template <typename T, bool kTileMode, int kD = 0>
__device__ __forceinline__ void quantize_tiles(const kern::QuantizeParams& p) {
  using E = typename T::Storage;
  constexpr int kBatch = kTileMode ? kern::kQuantizeTileBatch : kern::kQuantizeBlockBatch;
  const int warps_per_block = blockDim.x / 32;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / 32;
  if (tile >= p.tiles) return;
  // This warp's job: the last whose first tile it has reached (warp-uniform).
  int j = 0;
#pragma unroll
  for (int i = 1; i < kern::kMaxQuantizeJobs; ++i)
    if (i < p.num_jobs && tile >= p.job[i].first_tile) j = i;
  const kern::QuantizeJob& job = p.job[j];
  const int64_t local = tile - job.first_tile;
  const int lane = threadIdx.x & 31;
  // The warp's (b, h) and first token. In 32 bits wherever the job's tiles fit them (every tensor
  // a GPU holds today): a 64-bit division is a subroutine of some hundred instructions, and block
  // mode's warps convert only 8 tokens each (at D = 128), so two or three of them per warp would be
  // a large share of the kernel's instructions.
  const int tiles_per_bh = (job.S + p.tile_tokens - 1) / p.tile_tokens;
  int b, h, s0;
  if (local < (int64_t{1} << 31)) {
    const uint32_t l = static_cast<uint32_t>(local), per = static_cast<uint32_t>(tiles_per_bh);
    const uint32_t bh = l / per, heads = static_cast<uint32_t>(job.H);
    b = static_cast<int>(bh / heads);
    h = static_cast<int>(bh - static_cast<uint32_t>(b) * heads);
    s0 = static_cast<int>(l - bh * per) * p.tile_tokens;
  } else {
    const int64_t bh = local / tiles_per_bh;
    b = static_cast<int>(bh / job.H);
    h = static_cast<int>(bh % job.H);
    s0 = static_cast<int>(local % tiles_per_bh) * p.tile_tokens;
  }
  const int rows = min(p.tile_tokens, job.S - s0);
  const E* x = static_cast<const E*>(job.x.data) + b * job.x.stride_b + h * job.x.stride_h;
  E* y = static_cast<E*>(job.y.data) + b * job.y.stride_b + h * job.y.stride_h;
  const int row_groups = (kD > 0 ? kD : p.D) / kNvfp4GroupSize;
  const int groups = rows * row_groups;
  auto src = [&](int g) { return x + (s0 + g / row_groups) * job.x.stride_s + (g % row_groups) * 16; };
  // y's row of token s: s itself, or (owned_order) its row in the Hopper forward's tile order.
  auto y_row = [&](int s) { return job.owned_order ? owned_row_of_token(s) : s; };
  auto dst = [&](int g) { return y + y_row(s0 + g / row_groups) * job.y.stride_s + (g % row_groups) * 16; };
  auto mean = [&](int g) { return job.mean != nullptr ? job.mean + (g % row_groups) * 16 : nullptr; };

  Nvfp4SecondLevel second;  // block mode: enc = dec = 1
  if (kTileMode && job.quantize) {  // one second-level scale over the tile's values
    float amax = 0.0f;
    for (int g = lane; g < groups; g += 32) {
      float v[kNvfp4GroupSize];
      unpack_group<T>(load_raw(src(g)), mean(g), v);
#pragma unroll
      for (int i = 0; i < kNvfp4GroupSize; ++i) amax = nvfp4_amax_step(amax, v[i]);
    }
    second = nvfp4_second_level(warp_max(amax));
  }
  // kBatch groups per lane are loaded, as raw words, before any is written: block mode's unit is
  // one batch, so each warp waits for memory once, and y may be x (each group is read whole before
  // it is written, and groups do not overlap). Block mode's 2 groups per lane and its own kernel,
  // without the tile mode's code, take 64 registers in bf16, 32 warps per SM (a 32-token unit of 8
  // groups per lane would take 122 registers, 16 warps per SM). Warps that convert, not bytes in
  // flight, are what this kernel needs: a persistent grid of a few warps per SM, each loading its
  // next tile while converting one, leaves too few warps converting.
  for (int g0 = lane; g0 < groups; g0 += 32 * kBatch) {
    RawGroup raw[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (g0 + 32 * k < groups) raw[k] = load_raw(src(g0 + 32 * k));
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (g0 + 32 * k >= groups) continue;
      float v[kNvfp4GroupSize];
      unpack_group<T>(raw[k], mean(g0 + 32 * k), v);
      if (job.quantize) {
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < kNvfp4GroupSize; ++i) amax = nvfp4_amax_step(amax, v[i]);
        // (Block mode: the same scale and reciprocal without the division's slow path, bitwise.)
        const Nvfp4Group grp = kTileMode ? nvfp4_tile_group(amax, second) : nvfp4_block_group(amax);
#pragma unroll
        for (int i = 0; i < kNvfp4GroupSize; ++i) v[i] = nvfp4_fake_quant(grp, v[i]);
      }
      store_group<T>(dst(g0 + 32 * k), v);
    }
  }
  // owned_order: the (b, h)'s last warp also writes the zero rows that pad y to whole 64-key tiles
  // (the forward loads whole tiles, and V's rows past S must read as 0).
  if (job.owned_order && s0 + rows == job.S) {
    const int pad_groups = (owned_padded_rows(job.S) - job.S) * row_groups;
    const float zeros[kNvfp4GroupSize] = {};
    for (int g = lane; g < pad_groups; g += 32)
      store_group<T>(y + y_row(job.S + g / row_groups) * job.y.stride_s + (g % row_groups) * 16, zeros);
  }
}

}  // namespace
}  // namespace fva::dev

// Block mode (scale_mode FVA_SCALE_BLOCK) and tile mode: one kernel each, so that block mode's few
// raw words set its registers alone. Block mode in bf16 (QAT's) fits 64 registers, 8 blocks of 128
// threads per SM; in f16 the same bound spills 16 bytes on sm_90a, so it takes the 70 it needs there
// (7 blocks; 63 and 56 on sm_100a and sm_120).
// Block mode at D = 64 and 128 (the attention ops' head dimensions) has kernels of its own, _d64 and
// _d128, with D a constant; the plain names serve every other D.
extern "C" __global__ void __launch_bounds__(128, 8) fva_nvfp4_quantize_bf16(const fva::kern::QuantizeParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
  fva::dev::quantize_tiles<fva::dev::Bf16, false>(p);
}
extern "C" __global__ void fva_nvfp4_quantize_f16(const fva::kern::QuantizeParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
  fva::dev::quantize_tiles<fva::dev::F16, false>(p);
}
extern "C" __global__ void __launch_bounds__(128, 8) fva_nvfp4_quantize_bf16_d64(const fva::kern::QuantizeParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
  fva::dev::quantize_tiles<fva::dev::Bf16, false, 64>(p);
}
extern "C" __global__ void __launch_bounds__(128, 8) fva_nvfp4_quantize_bf16_d128(const fva::kern::QuantizeParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
  fva::dev::quantize_tiles<fva::dev::Bf16, false, 128>(p);
}
extern "C" __global__ void fva_nvfp4_quantize_f16_d64(const fva::kern::QuantizeParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
  fva::dev::quantize_tiles<fva::dev::F16, false, 64>(p);
}
extern "C" __global__ void fva_nvfp4_quantize_f16_d128(const fva::kern::QuantizeParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
  fva::dev::quantize_tiles<fva::dev::F16, false, 128>(p);
}
extern "C" __global__ void fva_nvfp4_quantize_tile_bf16(const fva::kern::QuantizeParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
  fva::dev::quantize_tiles<fva::dev::Bf16, true>(p);
}
extern "C" __global__ void fva_nvfp4_quantize_tile_f16(const fva::kern::QuantizeParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
  fva::dev::quantize_tiles<fva::dev::F16, true>(p);
}
