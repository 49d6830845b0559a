// The QAT forward's shared-memory ring and its producer (until 6b151ab also the warp-specialized
// dQ kernel's; the layout keeps its generality: any number of query-side tiles): a block owns 64
// query rows per consumer warpgroup, loads its query-side tiles once (the forward: Q) and streams
// the K and V tiles its schedule lists through a kStages-deep shared-memory ring,
// filled by the TMA from one producer thread:
//     query tiles [kQueryTiles] | K [kStages tiles] | V [kStages tiles, each + a region of ones]
//     | mbarriers
// with a tile = 64 rows x D in D / 64 swizzled 64-column regions (1024-byte aligned), and the
// barriers: query (once), K full [kStages], V full [kStages], stage empty [kStages] (one arrival
// per consumer warp). K and V have separate full barriers so the S product can start before V lands.
// In a cluster of two blocks over the same key tiles (the QAT forward's pairs), each block's
// producer loads half of every stage into both blocks' rings by TMA multicast (rank 0 K, rank 1
// V), each block arms its own full barriers for the whole stage, and a stage is empty once the
// consumer warps of both blocks have released it (each warp arrives on both blocks' barrier):
// FlashAttention-3's clusters for its non-causal D >= 128 forward. The L2 is read once per pair.
#pragma once

#include "shared/kernel_params.h"
#include "primitives/sm90.cuh"

namespace fva::dev::sm90 {

// Registers per thread after setmaxnreg: the producer keeps the minimum, the consumers take the
// rest of the block's share (65536 per SM over kThreads x blocks-per-SM threads).
template <int kConsumers>
struct RegisterSplit;
template <>
struct RegisterSplit<1> {  // 2 blocks x 256 threads: 128 each at launch (dK/dV)
  static constexpr int kProducer = 24, kConsumer = 232;
};
template <>
struct RegisterSplit<2> {  // 1 block x 384 threads: 168 each at launch (the QAT forward)
  static constexpr int kProducer = 24, kConsumer = 240;
};

template <int D, int kQueryTiles, int kStages>
struct QueryStreamLayout {
  static constexpr int kRegionBytes = 64 * 128;  // 64 rows x 64 16-bit columns
  static constexpr int kRegions = D / 64;
  static constexpr int kTileBytes = kRegions * kRegionBytes;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQueryTiles * kTileBytes;
  static constexpr int kV = kK + kStages * kTileBytes;
  // A V stage and, right after it, one region of ones: read as the (D / 64 + 1)-th 64-column
  // region of an MN-major B operand of N = D + 8 (the regions' stride is the descriptor's), its
  // first 8 columns are ones, so P·[V | ones] adds each row's sum of P beside P·V.
  static constexpr int kVStageBytes = kTileBytes + kRegionBytes;
  static constexpr int kBarriers = kV + kStages * kVStageBytes;
  static_assert(8 * (1 + 3 * kStages) <= 1024, "the barriers fit in their 1024 bytes");
  static_assert(kern::sm90_forward_smem_bytes(D, kQueryTiles, kStages) == kBarriers + 1024,
                "host and device disagree on the shared-memory layout");

  uint32_t base;  // the block's dynamic shared memory (1024-byte aligned)
  __device__ __forceinline__ uint32_t query_tile(int i) const { return base + kQ + i * kTileBytes; }
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

  // The producer thread: the query-side tiles (`maps[i]` rows q0 + 64 c, for consumer c, into
  // query tile i * kConsumers + c), then K and V of every tile the schedule lists, in its order.
  // keys_first (the QAT forward's split pieces, sm90/forward_split.cuh): before that, K alone of
  // every listed tile, each stage's V barrier completed by a plain arrival (no load), so the
  // barriers' phases stay in step. cluster (1 or 2) and rank: the block's cluster; with two, rank
  // 0 loads K and rank 1 V, each into both blocks' rings, and each block arms its own barriers
  // for the whole stage (a partner's bytes may land before the arming: the barrier's transaction
  // count may run negative within a phase).
  template <int kConsumers, int kMaps, typename Schedule>
  __device__ __forceinline__ void produce(const kern::TensorMap* const (&maps)[kMaps],
                                          const kern::TensorMap* k, const kern::TensorMap* v,
                                          const Schedule& sched, int q0, int h, int hk, int b,
                                          bool keys_first, uint32_t cluster, uint32_t rank) const {
    static_assert(kMaps * kConsumers == kQueryTiles, "one query tile per map and consumer");
    for (int i = 0; i < kMaps; ++i) tma_prefetch_descriptor(maps[i]);
    tma_prefetch_descriptor(k);
    tma_prefetch_descriptor(v);
    mbar_arrive_expect_tx(bar_query(), kQueryTiles * kTileBytes);
    for (int i = 0; i < kMaps; ++i)
      for (int c = 0; c < kConsumers; ++c)
        for (int r = 0; r < kRegions; ++r)
          tma_load_4d(query_tile(i * kConsumers + c) + r * kRegionBytes, maps[i], bar_query(),
                      64 * r, q0 + 64 * c, h, b);
    const bool loads_k = rank == 0, loads_v = rank + 1 == cluster;
    auto load = [&](uint32_t tile, const kern::TensorMap* map, uint32_t bar, int k0) {
      for (int r = 0; r < kRegions; ++r) {
        if (cluster == 1)
          tma_load_4d(tile + r * kRegionBytes, map, bar, 64 * r, k0, hk, b);
        else
          tma_load_4d_multicast(tile + r * kRegionBytes, map, bar, 0x3, 64 * r, k0, hk, b);
      }
    };
    int stage = 0;
    uint32_t phase = 0;
    if (keys_first) {
      for (int tile = sched.first(); tile >= 0; tile = sched.next(tile)) {
        mbar_wait(bar_empty(stage), phase ^ 1);
        // V's barrier first: its phase must be complete before the consumers (who wait for it,
        // then release the stage) let a partner multicast the next V's bytes onto it, or those
        // bytes would land in this phase (compute-sanitizer synccheck caught the other order).
        mbar_arrive(bar_v(stage));
        mbar_arrive_expect_tx(bar_k(stage), kTileBytes);
        if (loads_k) load(k_tile(stage), k, bar_k(stage), sched.key0(tile));
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    }
    for (int tile = sched.first(); tile >= 0; tile = sched.next(tile)) {
      mbar_wait(bar_empty(stage), phase ^ 1);  // a fresh barrier's previous phase counts as done
      const int k0 = sched.key0(tile);
      mbar_arrive_expect_tx(bar_k(stage), kTileBytes);
      if (loads_k) load(k_tile(stage), k, bar_k(stage), k0);
      mbar_arrive_expect_tx(bar_v(stage), kTileBytes);
      if (loads_v) load(v_tile(stage), v, bar_v(stage), k0);
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
  }
};

// Rows [first_row, 64) of a shared-memory tile set to zero by one warpgroup (tid = its thread),
// then made visible to the tensor cores' (async) proxy and to the whole warpgroup. A ragged VSA
// block's padding rows hold the caller's data, NaN included, which a product would carry through
// 0 * NaN.
template <int kRegions>
__device__ __forceinline__ void zero_tile_rows(uint32_t tile, int first_row, int tid) {
  constexpr int kRegionBytes = 64 * 128;
  for (int i = tid; i < (64 - first_row) * kRegions * 8; i += 128) {
    const int row = first_row + i / (kRegions * 8), rest = i % (kRegions * 8);
    const uint32_t addr = tile + (rest / 8) * kRegionBytes + row * 128 + (rest % 8) * 16;
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
  }
  fence_proxy_async();
  warpgroup_sync();
}

}  // namespace fva::dev::sm90
