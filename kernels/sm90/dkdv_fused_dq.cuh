// kFuseDq (sm90/attention_dkdv.cuh): the dK/dV kernel's share of dQ, FlashAttention-3's way. A
// block owns 128 keys, two consumers of 64; each writes its dSᵀ of a query tile to one of two
// shared-memory buffers (dK reads it from there, sm90/dkdv_epilogue.cuh's store_ds_transposed),
// and computes one 64-column half of the query tile's dQ part, dS K over all 128 keys (and
// rowsum(dS), dS against ones, for smooth-K), which it adds into the fp32 accumulator in the
// workspace (sm90/dq_accumulator.cuh); a convert kernel writes dQ.
#pragma once

#include "shared/kernel_params.h"
#include "primitives/sm90.cuh"
#include "sm90/dkdv_ring.cuh"
#include "sm90/dq_accumulator.cuh"

namespace fva::dev::sm90 {

// A consumer's half of dQ = dS K for the block's `index`-th query tile (columns 64 consumer ... +
// 63 of D; view: the consumer thread's DkdvConsumerView, sm90/dkdv_mainloop.cuh) over the block's
// 128 keys, issued once the tile's dS buffer is full: 8 k16 steps, 16 keys each, of dS (both
// consumers' dSᵀ in the tile's buffer, in key order, 2048 bytes a step) and of K (the first
// consumer's tile, then the second's), both read MN-major; and rowsum(dS), dS against ones (both
// consumers issue it: a wgmma under a branch makes ptxas insert waits, C7519; consumer 0 reduces
// it).
template <typename T, typename View>
__device__ __forceinline__ void issue_fused_dq(const View& view, int index, float (&dq)[32],
                                               float (&ds_sum)[4]) {
  using L = typename View::Ring;
  const L& ring = view.ring;
  const int consumer = view.consumer;
  const int u = index & 1;
  mbar_wait(ring.ds_full(u), (index >> 1) & 1);
  const uint64_t ds_desc = mnmajor_tile_descriptor(ring.ds_region(u, 0));
  const uint64_t ones_desc = mnmajor_tile_descriptor(ring.base + L::kOnes);
  const uint64_t k_desc = mnmajor_tile_descriptor(ring.base + L::kK + consumer * L::kRegionBytes);
  wgmma_fence();
#pragma unroll
  for (int step = 0; step < 4 * L::kConsumers; ++step) {
    const uint64_t a = smem_descriptor_advance(ds_desc, step * 2048);
    const uint64_t bk =
        smem_descriptor_advance(k_desc, (step / 4) * L::kTileBytes + (step % 4) * 2048);
    if (step == 0) {
      wgmma_ss_mn_first<T, 64>(dq, a, bk);
      wgmma_ss_mn_first<T, 8>(ds_sum, a, ones_desc);
    } else {
      wgmma_ss_mn<T, 64>(dq, a, bk);
      wgmma_ss_mn<T, 8>(ds_sum, a, ones_desc);
    }
  }
  wgmma_commit();
}

// After the wait that covers issue_fused_dq's products: the half (and consumer 0's rowsum(dS))
// added into the accumulator tile of query tile q (head q.head of batch b).
template <int D, typename View>
__device__ __forceinline__ void reduce_fused_dq(const View& view, const StagedTile& q,
                                                float (&dq)[32], float (&ds_sum)[4]) {
  const kern::Sm90BackwardParams& P = view.P;
  const kern::AttentionParams& p = view.p;
  const int b = view.b, consumer = view.consumer, warp = view.warp, lane = view.lane;
  fence_registers(dq);
  fence_registers(ds_sum);
  const int bhq = b * p.Hq + q.head, q_tile_index = q.row0 / 64;  // the query tile's (b, h)
  if (consumer == 0 && p.k_mean != nullptr)
    reduce_row_sums(ds_rowsum_tile(P, bhq, q_tile_index), ds_sum, warp, lane);
  reduce_dq_fragments<D>(dq_accumulator_tile<D>(P, bhq, q_tile_index), dq, consumer, warp, lane);
}

}  // namespace fva::dev::sm90
