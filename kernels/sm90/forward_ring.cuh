// The QAT forward's shared memory: a block owns 64 query rows per consumer warpgroup, holds their Q
// tiles for the whole block, and streams the K and V tiles its schedule lists through a
// kStages-deep ring that the producer (sm90/forward_producer.cuh) fills with the TMA:
//     Q [kConsumers tiles] | K [kStages tiles] | V [kStages tiles, each + a region of ones]
//     | mbarriers
// with a tile = 64 rows x D in D / 64 swizzled 64-column regions (1024-byte aligned), and the
// barriers: Q (once), K full [kStages], V full [kStages], stage empty [kStages] (one arrival per
// consumer warp). K and V have separate full barriers so the S product can start before V lands.
// In a cluster of two blocks over the same key tiles, each block's producer loads half of every
// stage into both blocks' rings by TMA multicast (rank 0 K, rank 1 V), each block arms its own
// full barriers for the whole stage, and a stage is empty once the consumer warps of both blocks
// have released it (each warp arrives on both blocks' barrier): FlashAttention-3's clusters for its
// non-causal D >= 128 forward. The L2 is read once per pair.
#pragma once

#include "shared/kernel_params.h"
#include "primitives/sm90.cuh"

namespace fva::dev::sm90 {

template <int D, int kConsumers, int kStages>
struct ForwardRing {
  static constexpr int kRegionBytes = 64 * 128;  // 64 rows x 64 16-bit columns
  static constexpr int kRegions = D / 64;
  static constexpr int kTileBytes = kRegions * kRegionBytes;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kConsumers * kTileBytes;
  static constexpr int kV = kK + kStages * kTileBytes;
  // A V stage and, right after it, one region of ones: read as the (D / 64 + 1)-th 64-column
  // region of an MN-major B operand of N = D + 8 (the regions' stride is the descriptor's), its
  // first 8 columns are ones, so P·[V | ones] adds each row's sum of P beside P·V.
  static constexpr int kVStageBytes = kTileBytes + kRegionBytes;
  static constexpr int kBarriers = kV + kStages * kVStageBytes;
  static_assert(8 * (1 + 3 * kStages) <= 1024, "the barriers fit in their 1024 bytes");
  static_assert(kern::sm90_forward_smem_bytes(D, kConsumers, kStages) == kBarriers + 1024,
                "host and device disagree on the shared-memory layout");

  uint32_t base;  // the block's dynamic shared memory (1024-byte aligned)
  // Consumer c's Q tile.
  __device__ __forceinline__ uint32_t query_tile(int c) const { return base + kQ + c * kTileBytes; }
  __device__ __forceinline__ uint32_t k_tile(int s) const { return base + kK + s * kTileBytes; }
  __device__ __forceinline__ uint32_t v_tile(int s) const { return base + kV + s * kVStageBytes; }
  __device__ __forceinline__ uint32_t bar_query() const { return base + kBarriers; }
  __device__ __forceinline__ uint32_t bar_k(int s) const { return bar_query() + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t bar_v(int s) const {
    return bar_query() + 8 * (1 + kStages + s);
  }
  __device__ __forceinline__ uint32_t bar_empty(int s) const {
    return bar_query() + 8 * (1 + 2 * kStages + s);
  }
  // Every stage's region of ones (T's 1.0: the chunks P·[V | ones] reads, store_ones_row), written
  // by the block's threads before its first __syncthreads and fenced for the tensor cores.
  template <typename T>
  __device__ __forceinline__ void fill_ones() const {
    for (int i = threadIdx.x; i < kStages * 64; i += blockDim.x)
      store_ones_row<T>(v_tile(i / 64) + kTileBytes, i % 64);
    fence_proxy_async();
  }

  // Thread 0, before the block's first __syncthreads (or cluster barrier). consumer_warps: the
  // arrivals that empty a stage (every consumer warp of the cluster's blocks).
  __device__ __forceinline__ void init_barriers(int consumer_warps) const {
    mbar_init(bar_query(), 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_k(s), 1);
      mbar_init(bar_v(s), 1);
      mbar_init(bar_empty(s), consumer_warps);
    }
    mbar_fence_init();
  }
};

}  // namespace fva::dev::sm90
