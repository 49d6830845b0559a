// The QAT forward's producer: one thread of the producer warpgroup fills the ring
// (sm90/forward_ring.cuh) with the TMA, the consumers' Q tiles once and then K and V of every key
// tile the schedule lists, in its order, each into the stage the consumers last released.
#pragma once

#include "shared/kernel_params.h"
#include "primitives/sm90.cuh"
#include "sm90/forward_ring.cuh"

namespace fva::dev::sm90 {

// Keys [k0, k0 + 64) of `map` at (hk, b) into `tile`, completing a transaction on `bar`: a plain
// TMA load in a cluster of one; in a cluster of two, multicast into the same tile of both blocks,
// each block's bytes completing its own barrier at the same offset.
template <typename Ring>
__device__ __forceinline__ void load_key_tile(uint32_t tile, const kern::TensorMap* map,
                                              uint32_t bar, int k0, int hk, int b,
                                              uint32_t cluster) {
  for (int r = 0; r < Ring::kRegions; ++r) {
    if (cluster == 1)
      tma_load_4d(tile + r * Ring::kRegionBytes, map, bar, 64 * r, k0, hk, b);
    else
      tma_load_4d_multicast(tile + r * Ring::kRegionBytes, map, bar, 0x3, 64 * r, k0, hk, b);
  }
}

// The producer thread: the query rows q0 + 64 c of `q` into consumer c's Q tile, then K and V of
// every tile the schedule lists. keys_first (a split tile's piece, sm90/forward_split.cuh): before
// that, K alone of every listed tile, each stage's V barrier completed by a plain arrival (no
// load), so the barriers' phases stay in step. cluster (1 or 2) and rank: the block's cluster;
// with two, rank 0 loads K and rank 1 V, each into both blocks' rings, and each block arms its own
// barriers for the whole stage (a partner's bytes may land before the arming: the barrier's
// transaction count may run negative within a phase).
template <int D, int kConsumers, int kStages, typename Schedule>
__device__ __forceinline__ void produce_forward_tiles(
    const ForwardRing<D, kConsumers, kStages>& ring, const kern::TensorMap* q,
    const kern::TensorMap* k, const kern::TensorMap* v, const Schedule& sched, int q0, int h,
    int hk, int b, bool keys_first, uint32_t cluster, uint32_t rank) {
  using Ring = ForwardRing<D, kConsumers, kStages>;
  tma_prefetch_descriptor(q);
  tma_prefetch_descriptor(k);
  tma_prefetch_descriptor(v);
  mbar_arrive_expect_tx(ring.bar_query(), kConsumers * Ring::kTileBytes);
  for (int c = 0; c < kConsumers; ++c)
    for (int r = 0; r < Ring::kRegions; ++r)
      tma_load_4d(ring.query_tile(c) + r * Ring::kRegionBytes, q, ring.bar_query(), 64 * r,
                  q0 + 64 * c, h, b);
  const bool loads_k = rank == 0, loads_v = rank + 1 == cluster;
  int stage = 0;
  uint32_t phase = 0;
  if (keys_first) {
    for (int tile = sched.first(); tile >= 0; tile = sched.next(tile)) {
      mbar_wait(ring.bar_empty(stage), phase ^ 1);
      // V's barrier first: its phase must be complete before the consumers (who wait for it,
      // then release the stage) let a partner multicast the next V's bytes onto it, or those
      // bytes would land in this phase.
      mbar_arrive(ring.bar_v(stage));
      mbar_arrive_expect_tx(ring.bar_k(stage), Ring::kTileBytes);
      if (loads_k)
        load_key_tile<Ring>(ring.k_tile(stage), k, ring.bar_k(stage), sched.key0(tile), hk, b,
                            cluster);
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
  }
  for (int tile = sched.first(); tile >= 0; tile = sched.next(tile)) {
    mbar_wait(ring.bar_empty(stage), phase ^ 1);  // a fresh barrier's previous phase counts as done
    const int k0 = sched.key0(tile);
    mbar_arrive_expect_tx(ring.bar_k(stage), Ring::kTileBytes);
    if (loads_k) load_key_tile<Ring>(ring.k_tile(stage), k, ring.bar_k(stage), k0, hk, b, cluster);
    mbar_arrive_expect_tx(ring.bar_v(stage), Ring::kTileBytes);
    if (loads_v) load_key_tile<Ring>(ring.v_tile(stage), v, ring.bar_v(stage), k0, hk, b, cluster);
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
}

}  // namespace fva::dev::sm90
