// The Hopper-native dQ kernel (sm_90a) of both backwards, QAT attention and VSA, in the VSA
// forward's shape (sm90/attention_forward_compact.cuh): one warpgroup per 64-row query tile, no
// producer warpgroup, three blocks per SM (at most 168 registers per thread; Q, dO, K and V tiles:
// 64 KiB at D=128). A block walks the forward's schedule for its rows (QAT: key tiles from 0, up to
// the diagonal when causal; VSA: the q block's q2k list):
//     S = Q Kᵀ, dP = dO Vᵀ                      (wgmma, shared-memory operands)
//     P = 2^(S scale log2e - lse) (masked: 0), dS = dtype(P (dP - Delta))           (ds_tile)
//     dQ += dS K                                (wgmma, dS from registers, K read MN-major)
// and finally stores dQ = scale (dQ + rowsum(dS) mean(k)) (the mean term: QAT smooth_k;
// sm90/dq_epilogue.cuh). Thread 0 loads the next key tile's K and V into the two key-side tiles,
// which swap roles every key tile (see the loop). A block's rows are its own and the tiles come in
// a fixed order, so dQ is a fixed-order sum: bitwise reproducible on every handle, no reduction
// buffer and no atomics. P's quantization plays no part in dQ (SPEC.md: dS uses the high-precision
// P), so every P scale mode runs here.
// Why not FlashAttention-3's warp-specialized shape (a producer warpgroup and a K/V ring, as QAT's
// forward): for VSA, a q block's list is its own, so consumers share no tiles and a producer per
// consumer leaves two consumers per SM; here three share an SM, whose warp schedulers run one
// block's dS arithmetic under the others' products. For QAT, a warp-specialized dQ (two consumers
// sharing each K/V tile, one block per SM) is no faster than this kernel, so one dQ kernel serves
// both.
// Where this kernel runs: only beyond the stored-dS budget (FVATTN_DS_BUDGET_MIB), for VSA, and
// for QAT on deterministic handles or at D = 64. Within it, the dK/dV kernel stores dS and
// sm90/attention_dq_from_ds.cuh needs one product per pair instead of this kernel's three; beyond
// it, QAT at D = 128 on handles that are not deterministic reduces dQ inside its dK/dV kernel
// (sm90/attention_dkdv.cuh, kFuseDq, 128 keys per block). VSA cannot: its key blocks have
// lists of their own, so a block cannot pair two, and with one 64-key block the fp32 reductions
// (32 KiB per pair, L2-bound) cost more than this kernel's recomputed S and dP.
#pragma once

#include <math_constants.h>

#include <type_traits>

#include "shared/kernel_params.h"
#include "primitives/block_terms.cuh"
#include "primitives/online_softmax.cuh"
#include "sm90/compact_tiles.cuh"
#include "sm90/dq_epilogue.cuh"
#include "sm90/zero_tile_rows.cuh"

namespace fva::dev::sm90 {

// lse and Delta of a thread's two rows (row_base, row_base + 8; bh = b Hq + h); a row past Sq
// contributes nothing (lse -inf selects its dS away, as for a row without a visible key).
__device__ __forceinline__ void load_dq_row_stats(const kern::AttentionParams& p, int b, int h,
                                                  int bh, int row_base, float (&lse)[2],
                                                  float (&delta)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_base + 8 * r;
    const bool ok = row < p.Sq;
    lse[r] = ok ? p.lse.data[b * p.lse.stride_b + h * p.lse.stride_h + row * p.lse.stride_s]
                : -CUDART_INF_F;
    delta[r] = ok ? p.delta[static_cast<int64_t>(bh) * p.Sq + row] : 0.0f;
  }
}

// dS = dtype(P (dP - Delta)) of one 64 x 64 tile from its S and dP fragments, P = 2^(S scale
// log2e - lse), as the A operands of dS K's 4 k16 steps (keys); ds_sum gathers the thread's part
// of rowsum(dS) (the QAT smooth-K term). Masked entries are selected away, never multiplied: a
// ragged block's padding slots may hold NaN in S and dP.
template <typename T, typename Schedule>
__device__ __forceinline__ void ds_tile(const Schedule& sched, int tile, int row0, int sq,
                                        int row_base, int t, float scale_log2,
                                        const float (&s)[8][4], const float (&dp)[8][4],
                                        const float (&lse)[2], const float (&delta)[2],
                                        float (&ds_sum)[2], uint32_t (&a_ds)[4][4]) {
  const int k0 = sched.key0(tile), n_valid = sched.valid_keys(tile);
  // kAllVisible: a tile every row of the block sees whole, all 64 rows real and the thread's two
  // lse finite, compiled without the per-element selects (about 5 integer and predicate
  // instructions per element).
  auto tile_ds = [&](auto all_visible) {
    constexpr bool kAllVisible = decltype(all_visible)::value;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int slot = j * 8 + 2 * t + (e & 1), r = e >> 1;
        const bool vis = kAllVisible || ((lse[r] != -CUDART_INF_F) &
                                         sched.visible(row_base + 8 * r, k0 + slot, slot, n_valid));
        const float pv = fast_exp2(fmaf(s[j][e], scale_log2, -lse[r]));
        ds[e] = vis ? T::round(pv * (dp[j][e] - delta[r])) : 0.0f;
        ds_sum[r] += ds[e];
      }
      pack_a_tile<T>(a_ds, j, ds);
    }
  };
  // An lse of -inf (a row the forward found no key for, or a caller's mark of one) takes the
  // selecting path, which gives its P = 0 as the CPU backend does, not 2^(s + inf).
  if (sched.unmasked(tile, row0) && row0 + 64 <= sq && lse[0] != -CUDART_INF_F && lse[1] != -CUDART_INF_F) {
    tile_ds(std::true_type{});
  } else {
    tile_ds(std::false_type{});
  }
}

template <typename T, int D, typename Schedule>
__device__ __forceinline__ void attention_dq_sm90(const kern::Sm90BackwardParams& P,
                                                  char* smem) {
  using L = CompactTiles<D, 4>;
  constexpr int kQ = 0, kDO = 1, kK = 2, kV = 3;  // tiles
  const kern::AttentionParams& p = P.a;
  const RecordCheck check = RecordCheck::load(p);  // the VSA layer's record, decided at the stores

  const L tiles{smem_addr(smem)};
  if (tiles.base & 1023) __trap();  // the 128-byte swizzle needs 1024-byte aligned regions
  const uint32_t q_tile = tiles.tile(kQ), do_tile = tiles.tile(kDO);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const CompactBlock at(p);
  const int bh = at.bh, b = at.b, h = at.h, hk = at.hk, row0 = at.row0;
  tiles.setup([&] {
    tma_prefetch_descriptor(&P.q);
    tma_prefetch_descriptor(&P.dout);
    tma_prefetch_descriptor(&P.k);
    tma_prefetch_descriptor(&P.v);
    tiles.load(kQ, &P.q, tiles.bar_query(), row0, h, b, 2);  // Q and dO on one barrier
    tiles.load(kDO, &P.dout, tiles.bar_query(), row0, h, b, 0);
  });
  const int row_base = row0 + 16 * warp + g;  // this thread's rows: row_base, row_base + 8
  const Schedule sched(p, b, h, row0);
  const int first = sched.first();
  tiles.load_first_keys(&P.k, &P.v, at, first >= 0 ? sched.key0(first) : -1);

  float lse[2], delta[2];
  load_dq_row_stats(p, b, h, bh, row_base, lse, delta);
  float dq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dq[i] = 0.0f;
  fence_registers(dq);  // distinct registers (see fence_registers)
  float ds_sum[2] = {0.0f, 0.0f};
  float s[8][4], dp[8][4];
  float(&s_flat)[32] = reinterpret_cast<float(&)[32]>(s);
  float(&dp_flat)[32] = reinterpret_cast<float(&)[32]>(dp);
  uint32_t a_ds[4][4];  // dS as the A operands of the tile's 4 k16 steps (keys)

  mbar_wait(tiles.bar_query(), 0);
  // The two key-side tiles swap roles every key tile: tile i's K sits where tile i - 1's V was.
  // The next K is loaded as soon as dP has read this V, and the next V once dS K has read this K;
  // so the next S starts on a K loaded under this tile's dS arithmetic and product, and only dP
  // waits for the V loaded last (rather than the next K waiting for dS K, and S for that load).
  // Each slot's barrier completes once per key tile, so one phase serves both.
  uint32_t phase = 0;
  int k_slot = kK;  // load_first_keys put the first tile's K in kK and its V in kV
  for (int tile = first; tile >= 0;) {
    const int next = sched.next(tile);
    const int v_slot = kK + kV - k_slot;
    auto bar_of = [&](int slot) { return slot == kK ? tiles.bar_k() : tiles.bar_v(); };
    const uint32_t k_tile = tiles.tile(k_slot), v_tile = tiles.tile(v_slot);
    mbar_wait(bar_of(k_slot), phase);
    wgmma_fence();
    wgmma_tiles_abt<T, D>(s_flat, q_tile, k_tile);
    wgmma_commit();  // S runs while the wait for V (a loop: its own pipeline stage) goes on
    mbar_wait(bar_of(v_slot), phase);
    wgmma_fence();
    wgmma_tiles_abt<T, D>(dp_flat, do_tile, v_tile);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(s_flat);
    fence_registers(dp_flat);
    warpgroup_sync();
    if (tid == 0 && next >= 0)
      tiles.load(v_slot, &P.k, bar_of(v_slot), sched.key0(next), hk, b);  // the next K

    ds_tile<T>(sched, tile, row0, p.Sq, row_base, t, p.scale_log2, s, dp, lse, delta, ds_sum,
               a_ds);
    if constexpr (Schedule::kPaddedBlocks) {
      // dS is 0 at a ragged block's padding slots, but 0 * NaN is not: those rows of K become
      // zeros before dS K reads them (S, which also read them, is complete in every warp). (QAT's
      // keys past Skv are outside the tensor: the TMA filled them with zeros.)
      const int n_valid = sched.valid_keys(tile);
      if (n_valid < 64) zero_tile_rows<L::kRegions>(k_tile, n_valid, tid);
    }
    // dQ += dS K: k16 steps over the tile's keys (16 rows, 2048 bytes each) of the MN-major K.
    wgmma_rs_tile_complete<T, D>(dq, a_ds, k_tile);
    warpgroup_sync();
    if (tid == 0 && next >= 0)
      tiles.load(k_slot, &P.v, bar_of(k_slot), sched.key0(next), hk, b);  // the next V
    k_slot = v_slot;
    phase ^= 1;
    tile = next;
  }

  store_dq<T, D>(p, check, b, h, row_base, t, dq, ds_sum);
}

}  // namespace fva::dev::sm90
