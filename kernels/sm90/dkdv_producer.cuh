// The dK/dV kernel's producer warp (sm90/attention_dkdv.cuh): loads the block's K and V once, then
// streams the (Q, dO) tile pairs of the query tiles its schedule lists through the ring
// (sm90/dkdv_ring.cuh) with the TMA, and writes each tile's lse, Delta and StagedTile beside them.
#pragma once

#include <math_constants.h>

#include "shared/kernel_params.h"
#include "primitives/sm90.cuh"
#include "sm90/dkdv_ring.cuh"

namespace fva::dev::sm90 {

// The schedule's 32-row query tiles, visited in pairs: a 64-row tile per even row0 (both schedules
// list a tile's two halves one after the other, the first at a multiple of 64).
template <typename Schedule>
struct QueryTiles64 {
  const Schedule& s;
  __device__ __forceinline__ typename Schedule::Cursor skip_odd(typename Schedule::Cursor c) const {
    while (c.valid() && (c.row0 & 63) != 0) c = s.next(c);
    return c;
  }
  __device__ __forceinline__ typename Schedule::Cursor first() const { return skip_odd(s.first()); }
  __device__ __forceinline__ typename Schedule::Cursor next(typename Schedule::Cursor c) const {
    return skip_odd(s.next(c));
  }
};

// The producer warpgroup: its first warp (lane 0 issues the TMA) loads the consumers' K and V
// tiles (keys k0 + 64 w for consumer w, head hk of batch b), then per listed query tile, into the
// next stage once the consumers have released it: Q and dO by the TMA, and lse and Delta of its 64
// rows (-inf and 0 past Sq) and its StagedTile by plain stores, whose 32 arrivals (release) join
// the TMA's on the stage's full barrier. The stream ends with a stage whose StagedTile is not
// valid.
template <bool kStoreDs, int D, int kStages, bool kFuseDq, typename Schedule>
__device__ __forceinline__ void produce_dkdv_tiles(const DkdvRing<D, kStages, kFuseDq>& ring,
                                                   const kern::Sm90BackwardParams& P,
                                                   const Schedule& sched,
                                                   const QueryTiles64<Schedule>& tiles,
                                                   float* row_stats, StagedTile* staged,
                                                   int b, int hk, int k0) {
  using L = DkdvRing<D, kStages, kFuseDq>;
  const kern::AttentionParams& p = P.a;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    if (lane == 0) {
      tma_prefetch_descriptor(&P.q);
      tma_prefetch_descriptor(&P.dout);
      mbar_arrive_expect_tx(ring.bar_kv(), 2 * L::kConsumers * L::kTileBytes);
      for (int w = 0; w < L::kConsumers; ++w)
        for (int r = 0; r < L::kRegions; ++r) {
          const int at = w * L::kTileBytes + r * L::kRegionBytes;
          tma_load_4d(ring.base + L::kK + at, &P.k, ring.bar_kv(), 64 * r, k0 + 64 * w, hk, b);
          tma_load_4d(ring.base + L::kV + at, &P.v, ring.bar_kv(), 64 * r, k0 + 64 * w, hk, b);
        }
    }
    int stage = 0;
    uint32_t phase = 0;
    for (auto c = tiles.first(); c.valid(); c = tiles.next(c)) {
      // The tile's lse and Delta are loaded before the wait for its stage, so their latency hides
      // under it.
      float lse[2], delta[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = c.row0 + lane + 32 * i;
        const bool ok = row < p.Sq;
        lse[i] = ok ? p.lse.data[b * p.lse.stride_b + c.head * p.lse.stride_h +
                                 row * p.lse.stride_s]
                    : -CUDART_INF_F;
        delta[i] = ok ? p.delta[(static_cast<int64_t>(b) * p.Hq + c.head) * p.Sq + row] : 0.0f;
      }
      mbar_wait(ring.bar_empty(stage), phase ^ 1);
      if (lane == 0) {
        mbar_arrive_expect_tx(ring.bar_full(stage), 2 * L::kTileBytes);
        for (int r = 0; r < L::kRegions; ++r) {
          tma_load_4d(ring.q_tile(stage) + r * L::kRegionBytes, &P.q, ring.bar_full(stage), 64 * r,
                      c.row0, c.head, b);
          tma_load_4d(ring.do_tile(stage) + r * L::kRegionBytes, &P.dout, ring.bar_full(stage),
                      64 * r, c.row0, c.head, b);
        }
      }
      float* stats = row_stats + stage * 128;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        stats[lane + 32 * i] = lse[i];
        stats[64 + lane + 32 * i] = delta[i];
      }
      if (lane == 0) {
        int64_t ds_tile = 0;
        if constexpr (kStoreDs) {
          // The pair's tile (chunk-local q unit, query tile, slot).
          const int64_t unit = static_cast<int64_t>(b) * p.Hq + c.head -
                               static_cast<int64_t>(P.kv_unit0) * (p.Hq / p.Hkv);
          ds_tile = (unit * P.ds_q_tiles + (c.row0 >> 6)) * P.ds_slots + sched.ds_slot(c);
        }
        staged[stage] = StagedTile{c.head, c.row0, ds_tile};
      }
      mbar_arrive(ring.bar_full(stage));
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    // The end of the stream: a stage without loads whose tile is not valid (lane 0's plain arrival
    // stands for the TMA's).
    mbar_wait(ring.bar_empty(stage), phase ^ 1);
    if (lane == 0) {
      staged[stage] = StagedTile{-1, 0, 0};
      mbar_arrive(ring.bar_full(stage));
    }
    mbar_arrive(ring.bar_full(stage));
  }
}

}  // namespace fva::dev::sm90
