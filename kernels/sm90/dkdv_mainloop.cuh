// The dK/dV kernel's consumer warpgroup (sm90/attention_dkdv.cuh): 64 keys, and per query tile the
// producer stages (sm90/dkdv_producer.cuh),
//     Sᵀ = K Qᵀ, dPᵀ = V dOᵀ (wgmma, shared-memory operands)
//     Pᵀ = 2^(Sᵀ scale log2e - lse) (masked: 0), dSᵀ = dtype(Pᵀ (dPᵀ - Delta))
//     dV += [FQ_P](Pᵀ) dO, dK += dSᵀ Q (wgmma, P and dS from registers)
// then the stores of dK * scale and dV (sm90/dkdv_epilogue.cuh). Per query tile: Sᵀ, then dPᵀ
// (issued once the previous tile's dV/dK are done, which frees their operand registers) -> Pᵀ
// from Sᵀ while dPᵀ runs -> dSᵀ, FQ_P(Pᵀ) -> dV and dK, which stay in flight under the next tile's
// Sᵀ. (With dV issued before dSᵀ, to run under it, and FQ_P under dPᵀ, those accumulators would be
// in flight beside the arithmetic's registers, and ptxas serializes the wgmma, C7512.)
// QAT's FQ_P groups are 16 keys of one query column: the 8 quads of a warp (column_max), as in the
// portable kernel; only block P scales run here (tile and row scales stay on the portable kernel).
#pragma once

#include <math_constants.h>

#include <type_traits>

#include "shared/kernel_params.h"
#include "primitives/online_softmax.cuh"
#include "sm90/dkdv_epilogue.cuh"
#include "sm90/dkdv_fused_dq.cuh"
#include "sm90/dkdv_ring.cuh"
#include "primitives/block_terms.cuh"
#include "sm90/zero_tile_rows.cuh"

namespace fva::dev::sm90 {

// Pᵀ and dSᵀ of a query tile as the A operands of dV and dK (the 4 k16 steps of the tile's
// queries), kept alive until the wait that covers those products. Fused, dK reads dSᵀ from shared
// memory instead.
template <bool kFuseDq>
__device__ __forceinline__ void keep_dkdv_operands_alive(uint32_t (&a_p)[4][4],
                                                         uint32_t (&a_ds)[4][4]) {
  keep_operands_alive(a_p);
  if constexpr (!kFuseDq) keep_operands_alive(a_ds);
}

// What the pieces of a consumer thread's mainloop read: references to dkdv_consumer's locals
// (below), where the thread works and which keys it owns.
template <typename T, int D, typename Schedule, bool kQuantizeP, int kStages, bool kFuseDq,
          bool kStoreDs, bool kDeferDs>
struct DkdvConsumerView {
  using Ring = DkdvRing<D, kStages, kFuseDq>;
  static constexpr int kConsumers = Ring::kConsumers;

  const Ring& ring;
  const kern::Sm90BackwardParams& P;
  const kern::AttentionParams& p;
  const int& b;
  const int& hk;
  const int& consumer;  // 0, or warpgroup - 1 with two consumers
  const int& warp;
  const int& lane;
  const int& t;
  const int& slot_base;  // this thread's keys: slot_base, slot_base + 8
  const int& kc0;        // this consumer's first key
  const Schedule& keys;  // this consumer's 64 keys from kc0
  const int& n_keys;

  // Pᵀ of a query tile from Sᵀ (masked entries 0), lse_of its columns' lse; this thread's query
  // columns of the tile are 8j + 2t + {0, 1}, from row0. Returns which entries are visible (bit
  // 4j + e of st[j][e]). A tile the schedule says is wholly visible (kAllVisible) is compiled
  // without the per-element checks (about 5 integer and predicate instructions per element).
  template <bool kAllVisible>
  __device__ __forceinline__ uint32_t probabilities(float (&st)[8][4], const float2 (&lse_of)[8],
                                                    int row0) const {
    uint32_t visible = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 lse = lse_of[j];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = j * 8 + 2 * t + (e & 1), row = row0 + col;
        const int key_slot = slot_base + 8 * (e >> 1);
        const float l = (e & 1) ? lse.y : lse.x;
        const bool vis = kAllVisible || (l != -CUDART_INF_F &&
                                         keys.visible(row, kc0 + key_slot, key_slot, n_keys));
        st[j][e] = vis ? fast_exp2(fmaf(st[j][e], p.scale_log2, -l)) : 0.0f;
        visible |= static_cast<uint32_t>(vis) << (4 * j + e);
      }
    }
    return visible;
  }

  // dV += Pᵀ dO and dK += dSᵀ Q: k16 steps over the tile's queries (16 rows, 2048 bytes each) of
  // the MN-major dO and Q tiles of the stage. Fused: dSᵀ, the A operand of dK, comes from the
  // shared-memory tile dQ reads (K-major: the 4 k16 steps are 32 bytes apart in its 128-byte
  // rows; the buffer of the consumer's done-th query tile), which frees its registers.
  __device__ __forceinline__ void issue_dv_dk(float (&dv)[D / 2], float (&dk)[D / 2],
                                              uint32_t (&a_p)[4][4], uint32_t (&a_ds)[4][4],
                                              int stage, int done) const {
    const uint64_t do_desc = mnmajor_tile_descriptor(ring.do_tile(stage));
    const uint64_t q_desc = mnmajor_tile_descriptor(ring.q_tile(stage));
    [[maybe_unused]] const uint64_t ds_desc =
        kmajor_tile_descriptor(ring.ds_region(done & 1, consumer));
    wgmma_fence();
#pragma unroll
    for (int step = 0; step < 4; ++step) {
      wgmma_rs_mn<T, D>(dv, a_p[step], smem_descriptor_advance(do_desc, step * 2048));
      if constexpr (kFuseDq) {
        wgmma_ss_bmn<T, D>(dk, smem_descriptor_advance(ds_desc, step * 32),
                           smem_descriptor_advance(q_desc, step * 2048));
      } else {
        wgmma_rs_mn<T, D>(dk, a_ds[step], smem_descriptor_advance(q_desc, step * 2048));
      }
    }
    wgmma_commit();
  }

  // kStoreDs with kDeferDs: a tile's dSᵀ is stored during the next tile, after that tile's release
  // of its predecessor's stage (an mbarrier arrive, with release semantics), not just before it: a
  // release orders the stores before it, and waiting for them there can stall the consumer.
  // ds_pending: the tile (its index in P.ds_tiles) whose dSᵀ, still in a_ds, is stored next.
  __device__ __forceinline__ void store_pending_ds(int64_t& ds_pending,
                                                   const uint32_t (&a_ds)[4][4]) const {
    if constexpr (kStoreDs && kDeferDs) {
      if (ds_pending >= 0)
        store_ds_tile(
            static_cast<uint4*>(P.ds_tiles) + ds_pending * (kern::sm90_ds_tile_bytes / 16), a_ds,
            warp, lane);
      ds_pending = -1;
    }
  }
};

// Consumer warpgroup `warpgroup` of a block whose first key is k0 (head hk of batch b; sched the
// block's schedule): the mainloop over the query tiles the producer stages, until its
// end-of-stream stage, then dK * scale and dV.
template <typename T, int D, typename Schedule, bool kQuantizeP, int kStages, bool kFuseDq,
          bool kStoreDs, bool kDeferDs>
__device__ __forceinline__ void dkdv_consumer(const DkdvRing<D, kStages, kFuseDq>& ring,
                                              const kern::Sm90BackwardParams& P,
                                              const Schedule& sched, int warpgroup, int b, int hk,
                                              int k0) {
  using Ring = DkdvRing<D, kStages, kFuseDq>;
  constexpr int kConsumers = Ring::kConsumers;
  const kern::AttentionParams& p = P.a;
  const RecordCheck check = RecordCheck::load(p);  // the VSA layer's record, decided at the stores
  const int consumer = kConsumers == 1 ? 0 : warpgroup - 1;  // a constant when it can be
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int slot_base = warp * 16 + g;  // this thread's keys: slot_base, slot_base + 8
  // This consumer's 64 keys from kc0: their visibility, count (at most 0 past Skv) and outputs.
  const int kc0 = k0 + 64 * consumer;
  const Schedule second(p, b, hk, kc0);
  const Schedule& keys = kConsumers == 1 ? sched : second;  // one consumer: the block's schedule
  const int n_keys = keys.valid_keys();
  const uint32_t k_tile = ring.base + Ring::kK + consumer * Ring::kTileBytes;
  const uint32_t v_tile = ring.base + Ring::kV + consumer * Ring::kTileBytes;
  const DkdvConsumerView<T, D, Schedule, kQuantizeP, kStages, kFuseDq, kStoreDs, kDeferDs> view{
      ring, P, p, b, hk, consumer, warp, lane, t, slot_base, kc0, keys, n_keys};
  // kFuseDq: the query tiles this consumer has finished, and the last one (its dQ part runs one
  // tile late, see below).
  [[maybe_unused]] int done = 0;
  [[maybe_unused]] StagedTile last{-1, 0, 0};

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.0f;
  // Distinct registers from here: otherwise the compiler lets the zeros share one register and
  // copies them apart inside the wgmma pipeline, which serializes it (ptxas C7515).
  fence_registers(dk);
  fence_registers(dv);
  float st[8][4], dpt[8][4];
  float(&st_flat)[32] = reinterpret_cast<float(&)[32]>(st);
  float(&dpt_flat)[32] = reinterpret_cast<float(&)[32]>(dpt);
  uint32_t a_p[4][4], a_ds[4][4];  // Pᵀ (or FQ_P) and dSᵀ: the 4 k16 steps of the tile's queries
  // kFuseDq: the pair's dQ part and rowsum(dS), reduced into the workspace every query tile.
  [[maybe_unused]] float dq[32], ds_sum[4];

  mbar_wait(ring.bar_kv(), 0);
  if (kConsumers == 1 && n_keys < 64) {
    // A ragged VSA block: its padding slots hold the caller's data (NaN included), which dPᵀ
    // would carry into dS through 0 * NaN; zero those rows of K and V. (QAT's keys past Skv are
    // outside the tensor: the TMA already filled them with zeros. The two-consumer kernel is
    // QAT's.)
    zero_tile_rows<Ring::kRegions>(k_tile, n_keys, tid);
    zero_tile_rows<Ring::kRegions>(v_tile, n_keys, tid);
  }

  int stage = 0, pending = -1;
  uint32_t phase = 0;
  // kStoreDs: the tile whose dSᵀ is stored next (store_pending_ds).
  [[maybe_unused]] int64_t ds_pending = -1;
  for (;;) {
    mbar_wait(ring.bar_full(stage), phase);
    const StagedTile c = ring.staged()[stage];
    if (!c.valid()) break;
    wgmma_fence();
    wgmma_tiles_abt<T, D>(st_flat, k_tile, ring.q_tile(stage));
    wgmma_commit();
    // The previous tile's dV/dK products (committed before this tile's Sᵀ, so done first): their
    // stage goes back to the producer.
    wgmma_wait<1>();
    fence_registers(dk);
    fence_registers(dv);
    keep_dkdv_operands_alive<kFuseDq>(a_p, a_ds);
    if (pending >= 0) mbar_arrive(ring.bar_empty(pending));
    if constexpr (kDeferDs) view.store_pending_ds(ds_pending, a_ds);
    wgmma_fence();
    wgmma_tiles_abt<T, D>(dpt_flat, v_tile, ring.do_tile(stage));
    wgmma_commit();
    // The tile's lse, read while Sᵀ finishes, so that the first exponential does not wait for
    // them.
    const float* stats = ring.row_stats() + stage * 128;
    float2 lse_of[8];
#pragma unroll
    for (int j = 0; j < 8; ++j)
      lse_of[j] = *reinterpret_cast<const float2*>(stats + j * 8 + 2 * t);
    wgmma_wait<1>();  // Sᵀ (dPᵀ stays in flight)
    fence_registers(st_flat);

    // An lse of -inf (a row the forward found no key for, or a caller's mark of one) takes the
    // selecting path, which gives its P = 0 as the CPU backend does, not 2^(s + inf).
    bool finite_lse = true;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      finite_lse = finite_lse && lse_of[j].x != -CUDART_INF_F && lse_of[j].y != -CUDART_INF_F;
    // Pᵀ, then dSᵀ = dtype(Pᵀ (dPᵀ - Delta)) from the unquantized Pᵀ. A masked entry's dS is 0 by
    // selection, never by multiplying: its dPᵀ - Delta may be inf or NaN (a padding slot, or a row
    // with lse = -inf whose o or dO holds one), as the CPU backend never computes it. The choice of
    // path is per thread (the lse are), so the warpgroup's wait for dPᵀ stays outside it.
    const bool all_visible = finite_lse && keys.tile_all_visible(c.row0, n_keys, p.Sq);
    uint32_t visible = ~0u;
    if (all_visible) {
      view.template probabilities<true>(st, lse_of, c.row0);
    } else {
      visible = view.template probabilities<false>(st, lse_of, c.row0);
    }
    wgmma_wait<0>();  // dPᵀ
    fence_registers(dpt_flat);
    auto scores_to_ds = [&](auto all_visible_tile) {
      constexpr bool kAllVisible = decltype(all_visible_tile)::value;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 delta = *reinterpret_cast<const float2*>(stats + 64 + j * 8 + 2 * t);
        float ds[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float term = st[j][e] * (dpt[j][e] - ((e & 1) ? delta.y : delta.x));
          ds[e] = (kAllVisible || ((visible >> (4 * j + e)) & 1u)) ? term : 0.0f;
        }
        pack_a_tile<T>(a_ds, j, ds);
      }
    };
    if (all_visible) {
      scores_to_ds(std::true_type{});
    } else {
      scores_to_ds(std::false_type{});
    }
    // What dV multiplies: FQ_P(P), block scales (a group: this warp's 16 keys of one query
    // column), or P itself.
    if (kQuantizeP && p.quantize_p) {
      fake_quantize_columns_block<T>(st, a_p);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) pack_a_tile<T>(a_p, j, st[j]);
    }
    if constexpr (kFuseDq) {
      // dSᵀ to this tile's buffer, once both consumers have read what it held two tiles ago.
      const int u = done & 1;
      mbar_wait(ring.ds_empty(u), ((done >> 1) & 1) ^ 1);
      store_ds_transposed(ring.ds_region(u, consumer), a_ds, slot_base, t);
      fence_proxy_async();
      mbar_arrive(ring.ds_full(u));
      // dV and dK, then this consumer's half of the previous query tile's dQ part (its dS is
      // complete unless the other consumer is a whole tile behind, so the two consumers are not
      // held in step); one wait covers them, then the half is reduced into the accumulator and
      // the previous tile's dS buffer is released. (Reducing while dV and dK are in flight, or a
      // dQ accumulator as wide as D, makes ptxas spill and serialize the wgmma, C7512: dK and dV
      // hold 128 registers.)
      view.issue_dv_dk(dv, dk, a_p, a_ds, stage, done);
      if (last.valid()) {
        issue_fused_dq<T>(view, done - 1, dq, ds_sum);
        wgmma_wait<0>();
        reduce_fused_dq<D>(view, last, dq, ds_sum);
        mbar_arrive(ring.ds_empty((done - 1) & 1));
      } else {
        wgmma_wait<0>();
      }
      last = c;
      ++done;
    } else {
      view.issue_dv_dk(dv, dk, a_p, a_ds, stage, done);
      if constexpr (kStoreDs) {
        // The pair's tile (the producer's index), stored now (under dV and dK) or, kDeferDs,
        // during the next tile.
        const int64_t index = c.ds_tile;
        if constexpr (kDeferDs) {
          ds_pending = index;
        } else {
          store_ds_tile(static_cast<uint4*>(P.ds_tiles) + index * (kern::sm90_ds_tile_bytes / 16),
                        a_ds, warp, lane);
        }
      }
    }
    // dV and dK stay in flight under the next tile's Sᵀ; the stage they read is released after
    // the wait that covers them (the next tile's, or the one below). Fused: they are done.
    if constexpr (kFuseDq) {
      mbar_arrive(ring.bar_empty(stage));
    } else {
      pending = stage;
    }
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
  if constexpr (kFuseDq) {
    if (last.valid()) {  // the last query tile's dQ part
      issue_fused_dq<T>(view, done - 1, dq, ds_sum);
      wgmma_wait<0>();
      reduce_fused_dq<D>(view, last, dq, ds_sum);
    }
  }
  wgmma_wait<0>();
  fence_registers(dk);
  fence_registers(dv);
  keep_dkdv_operands_alive<kFuseDq>(a_p, a_ds);
  if constexpr (kDeferDs) view.store_pending_ds(ds_pending, a_ds);  // the last tile's

  store_dkdv<T, D>(p, check, b, hk, kc0, keys.output_rows(), slot_base, t, dk, dv);
}

}  // namespace fva::dev::sm90
