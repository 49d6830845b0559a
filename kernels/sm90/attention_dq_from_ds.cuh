// dQ on sm_90a from the dS tiles the dK/dV kernel stored (sm90/attention_dkdv.cuh, kStoreDs),
// for QAT attention and VSA: dQ = scale (dS K + rowsum(dS) mean(k)), one product per (query tile,
// key tile) pair instead of the three of the recomputing dQ kernel (sm90/attention_dq.cuh: S, dP,
// then dS K), and without the fused kernel's fp32 reductions (kFuseDq).
//
// Why: a dK/dV block owns one 64-key tile, which can only hand dQ its part through fp32
// reductions of 32 KiB per pair in the L2, which cost more than they save (VSA's key blocks have
// lists of their own, so a block cannot even pair two). Storing
// the pair's dS instead costs 8 KiB of plain, fully coalesced stores per pair, and dQ becomes a
// stream: per pair, a K tile (from the L2: K is small) and a dS tile (from memory), and one
// 64 x D x 64 product. Every query tile still sums its pairs in its schedule's order in its own
// registers, so dQ stays bitwise reproducible, with no atomics. The price is workspace, 8 KiB per
// pair, which the host bounds (sm90_ds_chunks: FVATTN_DS_BUDGET_MIB).
//
// The stored tile is dSᵀ as the dK/dV kernel's consumer warpgroup holds it (warp w: keys 16w ...
// 16w + 15, the A fragments of dK = dSᵀ Q's four k16 steps), 512 contiguous bytes per warp and
// step. Read back by warp w2 (query rows 16 w2 ...), the fragment of dK/dV warp s, step w2 holds
// the 8 x 8 blocks (keys 16s + {0, 8}) x (queries 16 w2 + {0, 8}); transposed in registers
// (movmatrix) they are the A fragment of dQ's k16 step s for this warp's rows.
//
// Shape: one warpgroup per 64-row query tile (the compact kernels' shape), a kStages ring of (K
// tile, dS tile) filled by warp 0's lane 0 (TMA for K, a bulk copy for dS;
// sm90/dq_from_ds_ring.cuh), four blocks per SM, so the SM's tensor cores work on one block's
// product while the others' loads are in flight. The stores: sm90/dq_epilogue.cuh.
#pragma once

#include "shared/kernel_params.h"
#include "primitives/block_terms.cuh"
#include "sm90/dq_epilogue.cuh"
#include "sm90/dq_from_ds_ring.cuh"
#include "sm90/zero_tile_rows.cuh"

namespace fva::dev::sm90 {

template <typename T, int D, typename Schedule, int kStages>
__device__ __forceinline__ void attention_dq_from_ds_sm90(const kern::Sm90BackwardParams& P,
                                                          char* smem) {
  using L = DqFromDsRing<D, kStages>;
  const kern::AttentionParams& p = P.a;
  const RecordCheck check = RecordCheck::load(p);  // the VSA layer's record, decided at the stores
  const L ring{smem_addr(smem)};
  if (ring.base & 1023) __trap();  // the 128-byte swizzle needs 1024-byte aligned regions

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int group = p.Hq / p.Hkv;
  const int bh = P.kv_unit0 * group + blockIdx.y;  // the launch covers a chunk of q units
  const int b = bh / p.Hq, h = bh % p.Hq, hk = h / group;
  const int qt = gridDim.x - 1 - blockIdx.x, row0 = 64 * qt;  // last first (causal: the longest)
  const int row_base = row0 + 16 * warp + g;  // this thread's rows: row_base, row_base + 8
  const Schedule sched(p, b, h, row0);
  // The block's stored tiles: one per slot (the schedule's tile index: VSA's q2k slot, QAT's key
  // tile).
  const uint4* ds_tiles =
      static_cast<const uint4*>(P.ds_tiles) +
      (static_cast<int64_t>(blockIdx.y) * P.ds_q_tiles + qt) * P.ds_slots * (L::kDsBytes / 16);

  // Warp 0 loads the listed tiles in order (its lane 0 issues), each into the stage its
  // predecessor kStages back has freed. Each warp walks the schedule through its own window
  // (Schedule::Window: VSA's list from registers, no dependent global loads per tile); warp 0 has
  // a second one, kStages tiles ahead, for the loads: a copy of the first, so the list is read
  // once.
  // (A window's pop reads the list's next 32 entries and their blocks' sizes once every 32 tiles,
  // two dependent L2 round trips: both windows pop while a product runs, so that wait overlaps
  // it. Every warp must issue each product, so a warp's stall before one holds the block.)
  typename Schedule::Window compute(sched);
  typename Schedule::Window loads = compute;
  const bool loader = __shfl_sync(0xffffffffu, warp, 0) == 0;  // warp-uniform, as ptxas sees it
  auto load = [&](int stage, const typename Schedule::Window::Tile& tile) {
    if (lane == 0) {
      mbar_arrive_expect_tx(ring.full(stage), L::kStageBytes);
      for (int r = 0; r < L::kRegions; ++r)
        tma_load_4d(ring.k_tile(stage) + r * L::kRegionBytes, &P.k, ring.full(stage), 64 * r,
                    tile.key0(), hk, b);
      bulk_load(ring.ds_tile(stage),
                ds_tiles + static_cast<int64_t>(tile.index) * (L::kDsBytes / 16), L::kDsBytes,
                ring.full(stage));
    }
  };
  if (loader) {
    if (lane == 0) {
      for (int s = 0; s < kStages; ++s) mbar_init(ring.full(s), 1);
      mbar_fence_init();
      tma_prefetch_descriptor(&P.k);
    }
    __syncwarp();
    for (int s = 0; s < kStages; ++s) {
      const auto first = loads.pop();
      if (!first.valid()) break;
      load(s, first);
    }
  }
  __syncthreads();

  float dq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dq[i] = 0.0f;
  fence_registers(dq);  // distinct registers (see fence_registers)
  uint32_t a_ds[4][4];
  float ds_sum[2] = {0.0f, 0.0f};  // rowsum(dS) of the thread's two rows (QAT smooth-K)
  const bool row_sums = p.k_mean != nullptr;
  int n = 0;  // tiles consumed: tile n sits in stage n % kStages, its phase's parity (n / kStages) & 1
  for (auto tile = compute.pop(); tile.valid(); ++n) {
    const int stage = n % kStages;
    mbar_wait(ring.full(stage), (n / kStages) & 1);
    load_ds_fragments(ring.ds_tile(stage), warp, lane, a_ds);
    if (row_sums) {  // registers 0 and 2 of a step: the thread's first row; 1 and 3: its second
#pragma unroll
      for (int step = 0; step < 4; ++step)
#pragma unroll
        for (int i = 0; i < 4; ++i) ds_sum[i & 1] += T::low(a_ds[step][i]) + T::high(a_ds[step][i]);
    }
    if constexpr (Schedule::kPaddedBlocks) {
      // dS is 0 at a ragged VSA block's padding slots, but 0 * NaN is not: those rows of K (the
      // caller's data) become zeros before the product reads them. (QAT's keys past Skv are
      // outside the tensor: the TMA filled them with zeros.)
      const int n_valid = tile.tokens();
      if (n_valid < 64) zero_tile_rows<L::kRegions>(ring.k_tile(stage), n_valid, tid);
    }
    wgmma_fence();
    wgmma_rs_tile_steps<T, D>(dq, a_ds, ring.k_tile(stage));
    wgmma_commit();
    const auto next = compute.pop();  // (the pops while the product runs, as above)
    // The loader's tile kStages on, into this stage once it is read (the other warps' copy of
    // `next` stands in: they never load).
    const auto refill = loader ? loads.pop() : next;
    wgmma_wait<0>();
    fence_registers(dq);
    keep_operands_alive(a_ds);
    warpgroup_sync();  // every warp's product has read the stage
    if (loader && refill.valid()) load(stage, refill);
    tile = next;
  }

  store_dq<T, D>(p, check, b, h, row_base, t, dq, ds_sum);
}

}  // namespace fva::dev::sm90
