// The dK/dV kernel's shared memory (sm90/attention_dkdv.cuh): the block's K and V tiles (one of
// each per consumer: 64 keys x D), loaded once, and a kStages ring of (Q, dO) query tiles with each
// tile's lse and Delta and what the producer tells the consumers about it (StagedTile):
//     K [kConsumers tiles] | V [kConsumers tiles] | Q, dO [2 tiles per stage]
//     | kFuseDq: dSᵀ [2 buffers x kConsumers regions], ones [16 x 64]
//     | lse, Delta [per stage 64 + 64 floats] | StagedTile [per stage] | mbarriers
// a tile being 64 rows x D in D / 64 swizzled 64-column regions of 8 KiB (1024-byte aligned).
// The barriers: K and V (once), stage full [kStages], stage empty [kStages] and, kFuseDq, dS full
// [2] and dS empty [2].
#pragma once

#include "shared/kernel_params.h"
#include "primitives/sm90.cuh"

namespace fva::dev::sm90 {

// A query tile as the producer hands it to the consumers, beside its lse and Delta in the stage:
// the schedule's cursor reduced to what the consumers use. The consumers read it from shared
// memory instead of walking the schedule themselves: VSA's cursor reads the inverse lists (four
// dependent global loads per tile), which would delay each tile's first product in the consumer;
// the producer runs stages ahead, so the loads cost it nothing. head < 0 ends the stream. ds_tile
// (kStoreDs): the pair's dS tile in P.ds_tiles, whose index arithmetic the producer does too.
struct StagedTile {
  int head, row0;
  int64_t ds_tile;
  __device__ __forceinline__ bool valid() const { return head >= 0; }
};

template <int D, int kStages, bool kFuseDq>
struct DkdvRing {
  static constexpr int kConsumers = kFuseDq ? 2 : 1;  // 64-key tiles per block
  static constexpr int kRegionBytes = 64 * 128;
  static constexpr int kRegions = D / 64;
  static constexpr int kTileBytes = kRegions * kRegionBytes;  // 64 rows x D
  static constexpr int kK = 0;                                 // consumer w's K: kK + w tiles
  static constexpr int kV = kConsumers * kTileBytes;           // consumer w's V: kV + w tiles
  static constexpr int kQ = 2 * kConsumers * kTileBytes;       // stage s: Q at kQ + 2s tiles
  // kFuseDq: dSᵀ in two buffers (query tiles alternate), each per consumer 64 keys x 64 queries
  // in one swizzled region (buffer u, consumer w: kDs + (u kConsumers + w) regions, so a buffer
  // holds the block's 128 keys of dS in order), and 16 x 64 16-bit ones.
  static constexpr int kDs = kQ + 2 * kStages * kTileBytes;
  static constexpr int kOnes = kDs + (kFuseDq ? 2 * kConsumers * kRegionBytes : 0);
  static constexpr int kRowStats = kOnes + (kFuseDq ? 2048 : 0);  // stage s: lse[64], Delta[64]
  static constexpr int kTiles = kRowStats + kStages * 2 * 64 * 4;  // stage s: its StagedTile
  static constexpr int kBarriers = kTiles + kStages * 16;
  static_assert(kern::sm90_dkdv_smem_bytes(D, kStages, kFuseDq) ==
                    kBarriers + 8 * (1 + 2 * kStages + (kFuseDq ? 4 : 0)),
                "host and device disagree on the shared-memory layout");

  char* smem;     // the block's dynamic shared memory (1024-byte aligned)
  uint32_t base;  // its shared-memory address

  // Per stage, the tile's lse (64 floats) and Delta (64 floats after them): stage s's at
  // row_stats() + 128 s.
  __device__ __forceinline__ float* row_stats() const {
    return reinterpret_cast<float*>(smem + kRowStats);
  }
  // Per stage, its StagedTile: stage s's at staged()[s].
  __device__ __forceinline__ StagedTile* staged() const {
    return reinterpret_cast<StagedTile*>(smem + kTiles);
  }

  // K and V: complete once both are loaded.
  __device__ __forceinline__ uint32_t bar_kv() const { return base + kBarriers; }
  // Stage s full (the TMA's bytes and the producer warp's 32 arrivals) and empty (every consumer
  // thread).
  __device__ __forceinline__ uint32_t bar_full(int s) const { return bar_kv() + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t bar_empty(int s) const {
    return bar_kv() + 8 * (1 + kStages + s);
  }
  // kFuseDq, per dS buffer u: full once both consumers wrote their dSᵀ (arrivals: every consumer
  // thread), empty once both read it (their dK and dQ products are complete).
  __device__ __forceinline__ uint32_t ds_full(int u) const {
    return bar_kv() + 8 * (1 + 2 * kStages + u);
  }
  __device__ __forceinline__ uint32_t ds_empty(int u) const {
    return bar_kv() + 8 * (3 + 2 * kStages + u);
  }
  __device__ __forceinline__ uint32_t ds_region(int u, int w) const {
    return base + kDs + (u * kConsumers + w) * kRegionBytes;
  }
  __device__ __forceinline__ uint32_t q_tile(int s) const { return base + kQ + 2 * s * kTileBytes; }
  __device__ __forceinline__ uint32_t do_tile(int s) const {
    return base + kQ + (2 * s + 1) * kTileBytes;
  }

  // Thread 0, before the block's first __syncthreads.
  __device__ __forceinline__ void init_barriers() const {
    mbar_init(bar_kv(), 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full(s), 1 + 32);
      // Every consumer thread arrives: each has read the stage's lse/Delta with plain loads, and
      // its own arrival (release) is what orders those reads before the producer's next stores.
      mbar_init(bar_empty(s), 128 * kConsumers);
    }
    if (kFuseDq) {
      for (int u = 0; u < 2; ++u) {
        mbar_init(ds_full(u), 128 * kConsumers);
        mbar_init(ds_empty(u), 128 * kConsumers);
      }
    }
    mbar_fence_init();
  }
};

}  // namespace fva::dev::sm90
