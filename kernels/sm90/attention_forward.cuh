// The Hopper-native QAT attention forward (sm_90a), built the way FlashAttention-3 builds its
// Hopper kernels:
//   - a producer warpgroup (one elected thread) streams Q once and then K and V tiles of 64 keys
//     through a kStages-deep shared-memory ring with the TMA, in the schedule's order
//     (sm90/forward_ring.cuh, sm90/forward_producer.cuh);
//   - kConsumers = 2 consumer warpgroups each own 64 query rows and run the mainloop over the key
//     tiles, taking turns at the tensor cores (sm90/forward_mainloop.cuh);
//   - each consumer stores its rows' o, o_hp and lse (sm90/forward_epilogue.cuh);
//   - setmaxnreg moves registers from the producer to the consumers (sm90/register_split.cuh).
// Two consumers share every K/V tile (128 query rows per block: half the L2 traffic per FLOP).
// VSA's forward is sm90/attention_forward_compact.cuh: its q blocks share no K/V tiles, and four
// producer-less blocks per SM beat two warp-specialized ones.
//
// The grid is one-dimensional; the tiles of its last, partial wave may be split over their key
// tiles, the pieces merging through the workspace (sm90/forward_split.cuh).
// Where the host launches it in clusters of two (P.cluster: not causal, an even count of query
// tiles per head), the two blocks run neighbouring query tiles of one head over the same key
// tiles, and their producers split the loads, each multicasting half of every stage into both
// rings (sm90/forward_ring.cuh): FlashAttention-3's clusters for its non-causal D >= 128 forward.
// The L2 then serves each K/V tile once per 256 query rows instead of per 128; the math is the
// same, bit for bit.
// Layout and instruction notes: primitives/sm90.cuh.
#pragma once

#include <math_constants.h>

#include "shared/kernel_params.h"
#include "sm90/forward_epilogue.cuh"
#include "sm90/forward_mainloop.cuh"
#include "sm90/forward_producer.cuh"
#include "sm90/forward_ring.cuh"
#include "sm90/forward_split.cuh"
#include "sm90/register_split.cuh"

namespace fva::dev::sm90 {

template <typename T, int D, typename Schedule, bool kQuantizeP, int kConsumers, int kStages>
__device__ __forceinline__ void attention_forward_sm90(const kern::Sm90ForwardParams& P,
                                                       char* smem) {
  using L = ForwardRing<D, kConsumers, kStages>;
  static_assert(!Schedule::kPaddedBlocks,
                "ragged (VSA) blocks need their V padding zeroed: sm90/attention_forward_compact.cuh");
  const kern::AttentionParams& p = P.a;

  const L ring{smem_addr(smem)};
  if (ring.base & 1023) __trap();  // the 128-byte swizzle needs 1024-byte aligned regions

  const int warpgroup = threadIdx.x / 128;  // 0: producer; 1..kConsumers: consumers
  // The block's query tile and its share of the key tiles (sm90/forward_split.cuh).
  const ForwardTile work(P, static_cast<int>(blockIdx.x));
  const int bh = work.tile / P.q_tiles;
  const int b = bh / p.Hq, h = bh % p.Hq;
  const int hk = h / (p.Hq / p.Hkv);
  // Heaviest query tiles first (causal): the last tiles see the most keys.
  const int q0 = (P.q_tiles - 1 - (work.tile - bh * P.q_tiles)) * 64 * kConsumers;
  // The block's tiles: those its last 64 rows see (causal QAT: a superset of the first rows').
  Schedule sched(p, b, h, q0 + 64 * (kConsumers - 1));
  if (work.pieces > 1) sched.restrict_to_piece(work.piece, work.pieces);
  // Quantized P: a piece but the last runs its keys through S alone first (sm90/forward_split.cuh).
  const bool keys_first = kQuantizeP && work.writes_partial();
  // A cluster of two (P.cluster, the launch's): the blocks share their K/V loads, so each stage's
  // release goes to both blocks' barriers, and no block exits before its partner is done arriving
  // on its barriers (the cluster barrier at the end).
  const uint32_t cluster = cluster_blocks(), rank = cluster_rank();
  if (cluster != static_cast<uint32_t>(P.cluster)) __trap();  // the grid's mapping assumes it

  if (threadIdx.x == 0) ring.init_barriers(kConsumers * 4 * static_cast<int>(cluster));
  ring.template fill_ones<T>();
  if (cluster > 1) {  // the partner's barriers are initialized before anything arrives on them
    cluster_arrive();
    cluster_wait();
  } else {
    __syncthreads();
  }

  if (warpgroup == 0) {
    setmaxnreg_dec<RegisterSplit<kConsumers>::kProducer>();
    if (threadIdx.x == 0)
      produce_forward_tiles(ring, &P.q, &P.k, &P.v, sched, q0, h, hk, b, keys_first, cluster,
                            rank);
    if (cluster > 1) {
      cluster_arrive();
      cluster_wait();
    }
    return;
  }

  setmaxnreg_inc<RegisterSplit<kConsumers>::kConsumer>();
  const auto consumer = ForwardConsumer<T, D, Schedule, kQuantizeP, kConsumers, kStages>::make(
      ring, sched, p, warpgroup, q0, cluster);
  consumer.run(P, work, keys_first);
}

}  // namespace fva::dev::sm90
