// NVFP4 fake quantization of P while it sits in MMA accumulator fragments (SPEC.md section 1), on
// top of the shared nvfp4/nvfp4.h. A group is 16 consecutive keys of one query row. Two layouts occur:
//   - forward and dQ: rows are queries, keys run along n, so a group is the 4 values a quad holds
//     in two neighbouring n8 tiles (reduced with quad_max);
//   - dK/dV: the products are transposed (rows are keys), so a group is one m16 column: the 2 values
//     each of the 8 quads holds (reduced with column_max).
#pragma once

#include <type_traits>

#include "primitives/sm80.cuh"
#include "nvfp4/nvfp4.h"

namespace fva::dev {

// Second-level factors of a tile or row (nvfp4.h: block mode by default).
using SecondLevel = Nvfp4SecondLevel;

// Quantizes the four values x[0..3] of one group member (already reduced: group_amax is the whole
// group's amax) in place.
template <int N>
__device__ __forceinline__ void fake_quantize_values(float (&x)[N], float group_amax,
                                                     SecondLevel second) {
  const Nvfp4Group grp = nvfp4_group(group_amax, second);
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = nvfp4_fake_quant(grp, x[i]);
}

// A block-scale group (dec = 1) whose scale lane `src` computed (`mine` there), for every lane:
// the groups a lane's values belong to are computed once and handed out by shuffles.
__device__ __forceinline__ Nvfp4Group nvfp4_block_group_from(const Nvfp4Group& mine, int src) {
  Nvfp4Group grp;
  grp.e4m3 = __shfl_sync(0xffffffffu, mine.e4m3, src);
  grp.dec = 1.0f;
  grp.reciprocal = __shfl_sync(0xffffffffu, mine.reciprocal, src);
  return grp;
}

// Block-scale FQ_P of P in the dK/dV layout, for a warp's 16 keys x 8 n8 tiles of queries, packed
// into the A operands of dV's 4 k16 steps (v itself is left as it is: dS needs the unquantized P).
// The group of (tile j, column i) is v[j][i] and v[j][2 + i] of the 8 lanes 4g + t (g = 0..7) that
// share t. Every lane of a column would otherwise compute all 16 of its groups' scales (the E4M3
// rounding and a reciprocal each), eight times over. Here the 8 lanes reduce their 16 amaxes by
// halving exchanges (after the xor-16, -8 and -4 steps, lane g holds the amaxes of groups 2g and
// 2g + 1, i.e. tile j = g), each computes its two groups' scales once, and every lane fetches the
// 16 it needs from lane 4j + t. The max of |x| is order-independent (NaN ignored either way), so
// each group's scale is bitwise the one column_max gives.
// For bf16, the rounding and decode run in bf16x2 arithmetic (e2m1_round_scale_bf16x2: bitwise the
// fp32 form's for these values, as in the forward's OwnedGroupTileSoftmax): a packed pair holds
// columns 0 and 1 (or 2 and 3) of a tile, one value of each of the lane's two groups, so lane g's
// two scales travel as one bf16 pair (exact: E4M3 values): per n8 tile three shuffles instead of
// four, and per pair of values twelve instructions (the products by the reciprocals included)
// instead of fifteen.
template <typename T>
__device__ __forceinline__ void fake_quantize_columns_block(const float (&v)[8][4],
                                                            uint32_t (&a)[4][4]) {
  const int lane = threadIdx.x & 31;
  float amax[16];
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
      amax[2 * j + i] = nvfp4_amax_step(nvfp4_amax_step(0.0f, v[j][i]), v[j][2 + i]);
  halving_max<16, 3, 16>(amax);  // lane bits 4, 3, 2: g's bits 2, 1, 0
  const Nvfp4Group mine[2] = {nvfp4_block_group(amax[0]), nvfp4_block_group(amax[1])};
  if constexpr (std::is_same_v<T, Bf16>) {
    const uint32_t my_scales = T::pack(mine[0].e4m3, mine[1].e4m3);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int src = 4 * j + (lane & 3);
      const uint32_t scale2 = __shfl_sync(0xffffffffu, my_scales, src);
      const float r0 = __shfl_sync(0xffffffffu, mine[0].reciprocal, src);
      const float r1 = __shfl_sync(0xffffffffu, mine[1].reciprocal, src);
      set_a_tile(a, j, e2m1_round_scale_bf16x2(v[j][0] * r0, v[j][1] * r1, scale2),
                 e2m1_round_scale_bf16x2(v[j][2] * r0, v[j][3] * r1, scale2));
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int src = 4 * j + (lane & 3);
      float q[4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const Nvfp4Group grp = nvfp4_block_group_from(mine[i], src);
        q[i] = nvfp4_fake_quant_nonneg_block(grp, v[j][i]);
        q[2 + i] = nvfp4_fake_quant_nonneg_block(grp, v[j][2 + i]);
      }
      pack_a_tile<T>(a, j, q);
    }
  }
}

// Exchanges one float per warp between the two warps of a pair (warps 2i and 2i+1) and returns the
// max of both. `slots` is shared memory of 2 * 4 floats; `use` counts calls (its parity picks the
// half, so a fast warp never overwrites a value its partner has yet to read).
__device__ __forceinline__ float pair_max(float mine, float* slots, int& use) {
  const int warp = threadIdx.x / 32;
  float* half = slots + (use & 1) * 4;
  if ((threadIdx.x & 31) == 0) half[warp] = mine;
  named_barrier_sync(1 + warp / 2, 64);
  const float other = half[warp ^ 1];
  ++use;
  return fmaxf(mine, other);
}

}  // namespace fva::dev
