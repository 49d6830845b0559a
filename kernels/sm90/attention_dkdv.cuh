// The Hopper-native dK/dV kernel (sm_90a) of the attention backward, shared by QAT attention and
// VSA; the Delta pass stays portable. A block owns 64 keys (or 128, fused below) and walks the
// 64-row query tiles its schedule lists (QAT: every query tile that sees the keys, the GQA group's
// heads in turn; VSA: the q blocks of the kv block's inverse list, ascending), so dK and dV are
// fixed-order sums: bitwise reproducible on every handle.
//   - a producer warp streams (Q, dO) tile pairs through a kStages ring with the TMA, after loading
//     K and V once, and copies each tile's lse and Delta beside them (sm90/dkdv_ring.cuh,
//     sm90/dkdv_producer.cuh);
//   - a consumer warpgroup per 64 keys computes, per query tile,
//         Sᵀ = K Qᵀ, dPᵀ = V dOᵀ (wgmma, shared-memory operands)
//         Pᵀ = 2^(Sᵀ scale log2e - lse) (masked: 0), dSᵀ = dtype(Pᵀ (dPᵀ - Delta))
//         dV += [FQ_P](Pᵀ) dO, dK += dSᵀ Q (wgmma, P and dS from registers)
//     (sm90/dkdv_mainloop.cuh) and finally stores dK * scale and dV (sm90/dkdv_epilogue.cuh). Two
//     such blocks share an SM, interleaving one's exponentials with the other's products; a dQ
//     kernel follows.
//   - kStoreDs (the default within the workspace budget, both backwards, every handle): each
//     pair's dSᵀ also goes to the workspace as it sits in the registers (8 KiB, fully coalesced
//     stores, issued during the next tile), and the dQ kernel of sm90/attention_dq_from_ds.cuh
//     sums dS K from it. Without it, the dQ kernel of sm90/attention_dq.cuh recomputes S and dP.
//   - kFuseDq (QAT at D = 128, handles that are not deterministic, beyond the stored-dS budget):
//     dQ is computed here instead, FlashAttention-3's way (sm90/dkdv_fused_dq.cuh). A block owns
//     128 keys, two consumers of 64 (one block per SM); each adds its half of each query tile's dQ
//     part into the fp32 accumulator in the workspace (sm90/dq_accumulator.cuh), and a convert
//     kernel writes dQ. That saves the dQ kernel's recomputed S and dP (7 products per pair become
//     5). The dS tiles go through two buffers with mbarriers, and each consumer computes a tile's
//     dQ half while working on the next tile, so the two are not held in step. Why 128 keys: the
//     reductions are L2-bound, and a 64-key block's 32 KiB per pair costs more than the dQ kernel.
#pragma once

#include "shared/kernel_params.h"
#include "primitives/block_terms.cuh"
#include "primitives/sm90.cuh"
#include "schedules/dkdv_grid.cuh"
#include "sm90/dkdv_mainloop.cuh"
#include "sm90/dkdv_producer.cuh"
#include "sm90/dkdv_ring.cuh"
#include "sm90/register_split.cuh"

namespace fva::dev::sm90 {

// kDeferDs (with kStoreDs): a tile's dS stores wait for the next tile (DkdvConsumerView's
// store_pending_ds): the default for VSA; QAT's consumer does more arithmetic per tile (FQ_P),
// under which the stores hide when issued at once.
template <typename T, int D, typename Schedule, bool kQuantizeP, int kStages, bool kFuseDq,
          bool kStoreDs = false, bool kDeferDs = !Schedule::kMayQuantizeP>
__device__ __forceinline__ void attention_backward_dkdv_sm90(const kern::Sm90BackwardParams& P,
                                                             char* smem) {
  using L = DkdvRing<D, kStages, kFuseDq>;
  constexpr int kConsumers = L::kConsumers;
  // The fused kernel: two consumers, each 64 keys and, of dQ = dS K over the block's 128 keys, one
  // 64-column half of D. QAT only: its keys past Skv are zeros from the TMA (a ragged VSA block's
  // padding rows would need zeroing, which runs on one warpgroup's barrier).
  static_assert(!kFuseDq || (D == 128 && Schedule::kMayQuantizeP),
                "the fused dQ kernel covers QAT at D = 128");
  // kStoreDs: every pair's dS tile goes to P.ds_tiles for the dQ kernel, which then needs no S
  // and dP of its own (sm90/attention_dq_from_ds.cuh).
  static_assert(!kStoreDs || !kFuseDq, "dQ comes from stored dS or from the fused reductions");
  const kern::AttentionParams& p = P.a;

  const uint32_t base = smem_addr(smem);
  if (base & 1023) __trap();  // the 128-byte swizzle needs 1024-byte aligned regions
  const L ring{smem, base};

  const int warpgroup = threadIdx.x / 128;
  // The block's unit (stored dS: of a chunk of the units) and first key (VSA: its kv block in the
  // inverse's order, longest lists first; schedules/dkdv_grid.cuh).
  const DkdvBlock blk = dkdv_block<Schedule>(p, kStoreDs ? P.kv_unit0 : 0);
  const int b = blk.unit / p.Hkv, hk = blk.unit % p.Hkv;
  const int k0 = blk.key_block * 64 * kConsumers;
  const Schedule sched(p, b, hk, k0);  // the query tiles the block walks
  const QueryTiles64<Schedule> tiles{sched};
  // Where the producer writes, per stage, lse and Delta of the tile's 64 rows (stage s's at
  // row_stats + 128 s) and its StagedTile: ring.row_stats() and ring.staged(), which the consumers
  // read (sm90/dkdv_ring.cuh).
  float* const row_stats = reinterpret_cast<float*>(smem + L::kRowStats);
  StagedTile* const staged = reinterpret_cast<StagedTile*>(smem + L::kTiles);

  if (threadIdx.x == 0) ring.init_barriers();
  if (kFuseDq) fill_ones_tile<T>(ring.base + L::kOnes);
  __syncthreads();

  if (warpgroup == 0) {
    setmaxnreg_dec<RegisterSplit<kConsumers>::kProducer>();
    produce_dkdv_tiles<kStoreDs>(ring, P, sched, tiles, row_stats, staged, b, hk, k0);
    return;
  }

  setmaxnreg_inc<RegisterSplit<kConsumers>::kConsumer>();
  dkdv_consumer<T, D, Schedule, kQuantizeP, kStages, kFuseDq, kStoreDs, kDeferDs>(
      ring, P, sched, warpgroup, b, hk, k0);
}

}  // namespace fva::dev::sm90
