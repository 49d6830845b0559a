// The stored-dS dQ kernel's shared memory (sm90/attention_dq_from_ds.cuh): a kStages ring of
// (K tile, dS tile) stages, each on one barrier, and the dS tile's reads as dQ's A fragments.
#pragma once

#include "shared/kernel_params.h"
#include "primitives/sm90.cuh"

namespace fva::dev::sm90 {

template <int D, int kStages>
struct DqFromDsRing {
  static constexpr int kRegionBytes = 64 * 128;
  static constexpr int kRegions = D / 64;
  static constexpr int kTileBytes = kRegions * kRegionBytes;  // K: 64 keys x D
  static constexpr int kDsBytes = static_cast<int>(kern::sm90_ds_tile_bytes);
  static constexpr int kStageBytes = kTileBytes + kDsBytes;  // a multiple of 1024: K stays aligned
  static constexpr int kBarriers = kStages * kStageBytes;
  static_assert(kern::sm90_dq_from_ds_smem_bytes(D, kStages) == kBarriers + 8 * kStages,
                "host and device disagree on the shared-memory layout");

  uint32_t base;  // 1024-byte aligned
  __device__ __forceinline__ uint32_t k_tile(int s) const { return base + s * kStageBytes; }
  __device__ __forceinline__ uint32_t ds_tile(int s) const {
    return base + s * kStageBytes + kTileBytes;
  }
  __device__ __forceinline__ uint32_t full(int s) const { return base + kBarriers + 8 * s; }
};

// This warp's A fragments of dQ's four k16 steps (keys 16 step ...) from a stored dS tile in
// shared memory (laid out as sm90/attention_dq_from_ds.cuh describes): the fragment's blocks
// transposed, and its middle two swapped (the stored a[1] is keys + 8, the A fragment's a[1] rows
// + 8).
__device__ __forceinline__ void load_ds_fragments(uint32_t ds_tile, int warp, int lane,
                                                  uint32_t (&a)[4][4]) {
#pragma unroll
  for (int step = 0; step < 4; ++step) {
    uint32_t f[4];
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
                 : "r"(ds_tile + ((4 * step + warp) * 32 + lane) * 16)
                 : "memory");
    a[step][0] = transpose_8x8(f[0]);
    a[step][1] = transpose_8x8(f[2]);
    a[step][2] = transpose_8x8(f[1]);
    a[step][3] = transpose_8x8(f[3]);
  }
}

}  // namespace fva::dev::sm90
