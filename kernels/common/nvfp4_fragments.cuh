// NVFP4 fake quantization of P while it sits in MMA accumulator fragments (SPEC.md section 1), on
// top of the shared nvfp4.h. A group is 16 consecutive keys of one query row. Two layouts occur:
//   - forward and dQ: rows are queries, keys run along n, so a group is the 4 values a quad holds
//     in two neighbouring n8 tiles (reduced with quad_max);
//   - dK/dV: the products are transposed (rows are keys), so a group is one m16 column: the 2 values
//     each of the 8 quads holds (reduced with column_max).
#pragma once

#include "device_primitives.cuh"
#include "nvfp4.h"

namespace fva::dev {

// Second-level factors of a tile or row with the given amax (SPEC: enc = 2688 / max(amax, 1e-8),
// dec = 1 / enc). Divisions are IEEE-exact, as in the CPU reference, so both give the same scales.
struct SecondLevel {
  float enc = 1.0f, dec = 1.0f;
  static __device__ __forceinline__ SecondLevel of(float amax) {
    SecondLevel s;
    s.enc = nvfp4_second_level_enc(amax);
    s.dec = 1.0f / s.enc;
    return s;
  }
};

// Quantizes the four values x[0..3] of one group member (already reduced: group_amax is the whole
// group's amax) in place.
template <int N>
__device__ __forceinline__ void fake_quantize_values(float (&x)[N], float group_amax,
                                                     SecondLevel second) {
  const Nvfp4Group grp = nvfp4_group(group_amax, second.enc, second.dec);
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = nvfp4_fake_quant(grp, x[i]);
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
