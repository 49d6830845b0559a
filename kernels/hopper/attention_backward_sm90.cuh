// The Hopper-native dK/dV kernel (sm_90a) of the attention backward, shared by QAT attention and
// VSA; the Delta pass and the dQ kernel stay portable. One block owns a 64-key tile and walks the
// 64-row query tiles its schedule lists (QAT: every query tile that sees the keys, the GQA group's
// heads in turn; VSA: the q blocks of the kv block's inverse list, ascending), so every gradient is
// a fixed-order sum: bitwise reproducible on every handle.
//   - a producer warp streams (Q, dO) tile pairs through a kStages ring with the TMA, after loading
//     K and V once, and copies each tile's lse and Delta beside them;
//   - one consumer warpgroup computes, per query tile,
//         Sᵀ = K Qᵀ, dPᵀ = V dOᵀ (wgmma, shared-memory operands)
//         Pᵀ = 2^(Sᵀ scale log2e - lse) (masked: 0), dSᵀ = dtype(Pᵀ (dPᵀ - Delta))
//         dV += [FQ_P](Pᵀ) dO, dK += dSᵀ Q (wgmma, P and dS from registers)
//     and finally stores dK * scale and dV.
// Two blocks share an SM, interleaving one's exponentials with the other's products. QAT's FQ_P
// groups are 16 keys of one query column: the 8 quads of a warp (column_max), as in the portable
// kernel; only block P scales run here (tile and row scales stay on the portable kernel).
#pragma once

#include <math_constants.h>

#include <type_traits>

#include "common/kernel_params.h"
#include "common/online_softmax.cuh"
#include "hopper/query_stream_sm90.cuh"  // zero_tile_rows, RegisterSplit

namespace fva::dev::sm90 {

template <int D, int kStages>
struct BackwardLayout {
  static constexpr int kRegionBytes = 64 * 128;
  static constexpr int kRegions = D / 64;
  static constexpr int kTileBytes = kRegions * kRegionBytes;  // 64 rows x D
  static constexpr int kK = 0;
  static constexpr int kV = kTileBytes;
  static constexpr int kQ = 2 * kTileBytes;                    // stage s: Q at kQ + 2s tiles
  static constexpr int kRowStats = kQ + 2 * kStages * kTileBytes;  // stage s: lse[64], Delta[64]
  static constexpr int kBarriers = kRowStats + kStages * 2 * 64 * 4;
  static_assert(kern::sm90_dkdv_smem_bytes(D, kStages) == kBarriers + 8 * (1 + 2 * kStages),
                "host and device disagree on the shared-memory layout");
};

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

template <typename T, int D, typename Schedule, bool kQuantizeP, int kStages>
__device__ __forceinline__ void attention_backward_dkdv_sm90(const kern::Sm90BackwardParams& P,
                                                             char* smem) {
  using L = BackwardLayout<D, kStages>;
  using E = typename T::Storage;
  const kern::AttentionParams& p = P.a;

  const uint32_t base = smem_addr(smem);
  if (base & 1023) __trap();
  const uint32_t bar_kv = base + L::kBarriers;
  auto bar_full = [&](int s) { return bar_kv + 8 * (1 + s); };
  auto bar_empty = [&](int s) { return bar_kv + 8 * (1 + kStages + s); };
  auto q_tile = [&](int s) { return base + L::kQ + 2 * s * L::kTileBytes; };
  auto do_tile = [&](int s) { return base + L::kQ + (2 * s + 1) * L::kTileBytes; };

  const int warpgroup = threadIdx.x / 128;
  const int bh = blockIdx.y;
  const int b = bh / p.Hkv, hk = bh % p.Hkv;
  const int k0 = blockIdx.x * 64;
  const Schedule sched(p, b, hk, k0);
  const QueryTiles64<Schedule> tiles{sched};

  // Per stage, lse and Delta of the tile's 64 rows (-inf and 0 past Sq), written by the producer's
  // first warp with plain stores; its 32 arrivals (release) join the TMA's on the full barrier.
  float* row_stats = reinterpret_cast<float*>(smem + L::kRowStats);

  if (threadIdx.x == 0) {
    mbar_init(bar_kv, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full(s), 1 + 32);
      // Every consumer thread arrives: each has read the stage's lse/Delta with plain loads, and
      // its own arrival (release) is what orders those reads before the producer's next stores.
      mbar_init(bar_empty(s), 128);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    // ---- producer ------------------------------------------------------------------------------
    setmaxnreg_dec<RegisterSplit<1>::kProducer>();
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      if (lane == 0) {
        tma_prefetch_descriptor(&P.q);
        tma_prefetch_descriptor(&P.dout);
        mbar_arrive_expect_tx(bar_kv, 2 * L::kTileBytes);
        for (int r = 0; r < L::kRegions; ++r) {
          tma_load_4d(base + L::kK + r * L::kRegionBytes, &P.k, bar_kv, 64 * r, k0, hk, b);
          tma_load_4d(base + L::kV + r * L::kRegionBytes, &P.v, bar_kv, 64 * r, k0, hk, b);
        }
      }
      int stage = 0;
      uint32_t phase = 0;
      for (auto c = tiles.first(); c.valid(); c = tiles.next(c)) {
        // The tile's lse and Delta are loaded before the wait for its stage, so their latency
        // hides under it.
        float lse[2], delta[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int row = c.row0 + lane + 32 * i;
          const bool ok = row < p.Sq;
          lse[i] = ok ? p.lse.data[b * p.lse.stride_b + c.head * p.lse.stride_h + row * p.lse.stride_s]
                      : -CUDART_INF_F;
          delta[i] = ok ? p.delta[(static_cast<int64_t>(b) * p.Hq + c.head) * p.Sq + row] : 0.0f;
        }
        mbar_wait(bar_empty(stage), phase ^ 1);
        if (lane == 0) {
          mbar_arrive_expect_tx(bar_full(stage), 2 * L::kTileBytes);
          for (int r = 0; r < L::kRegions; ++r) {
            tma_load_4d(q_tile(stage) + r * L::kRegionBytes, &P.q, bar_full(stage), 64 * r,
                        c.row0, c.head, b);
            tma_load_4d(do_tile(stage) + r * L::kRegionBytes, &P.dout, bar_full(stage), 64 * r,
                        c.row0, c.head, b);
          }
        }
        float* stats = row_stats + stage * 128;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          stats[lane + 32 * i] = lse[i];
          stats[64 + lane + 32 * i] = delta[i];
        }
        mbar_arrive(bar_full(stage));
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    }
    return;
  }

  // ---- consumer ---------------------------------------------------------------------------------
  setmaxnreg_inc<RegisterSplit<1>::kConsumer>();
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int slot_base = warp * 16 + g;  // this thread's keys: slot_base, slot_base + 8
  const int n_keys = sched.valid_keys();

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
  auto keep_alive = [&]() {
    keep_operands_alive(a_p);
    keep_operands_alive(a_ds);
  };

  mbar_wait(bar_kv, 0);
  if (n_keys < 64) {
    // A ragged VSA block: its padding slots hold the caller's data (NaN included), which dPᵀ would
    // carry into dS through 0 * NaN; zero those rows of K and V. (QAT's keys past Skv are outside
    // the tensor: the TMA already filled them with zeros.)
    zero_tile_rows<L::kRegions>(base + L::kK, n_keys, tid);
    zero_tile_rows<L::kRegions>(base + L::kV, n_keys, tid);
  }

  // Per query tile: Sᵀ, then dPᵀ (issued once the previous tile's dV/dK are done, which frees their
  // operand registers) -> Pᵀ from Sᵀ while dPᵀ runs -> dSᵀ, FQ_P(Pᵀ) -> dV and dK, which stay in
  // flight under the next tile's Sᵀ. (dV issued before dSᵀ, to run under it, with FQ_P under dPᵀ
  // measured slower, 6.9 against 5.6 ms for QAT's dK/dV at S=16384: with those accumulators in
  // flight beside the arithmetic's registers, ptxas serializes the wgmma, C7512.)
  int stage = 0, pending = -1;
  uint32_t phase = 0;
  for (auto c = tiles.first(); c.valid(); c = tiles.next(c)) {
    mbar_wait(bar_full(stage), phase);
    wgmma_fence();
    wgmma_tiles_abt<T, D>(st_flat, base + L::kK, q_tile(stage));
    wgmma_commit();
    // The previous tile's dV/dK products (committed before this tile's Sᵀ, so done first): their
    // stage goes back to the producer.
    wgmma_wait<1>();
    fence_registers(dk);
    fence_registers(dv);
    keep_alive();
    if (pending >= 0) mbar_arrive(bar_empty(pending));
    wgmma_fence();
    wgmma_tiles_abt<T, D>(dpt_flat, base + L::kV, do_tile(stage));
    wgmma_commit();
    wgmma_wait<1>();  // Sᵀ (dPᵀ stays in flight)
    fence_registers(st_flat);

    // Pᵀ (masked entries 0); this thread's query columns of the tile are 8j + 2t + {0, 1}. A tile
    // the schedule says is wholly visible (kAllVisible) is compiled without the per-element checks
    // (about 5 integer and predicate instructions per element).
    const float* stats = row_stats + stage * 128;
    auto probabilities = [&](auto all_visible) {
      constexpr bool kAllVisible = decltype(all_visible)::value;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 lse = *reinterpret_cast<const float2*>(stats + j * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = j * 8 + 2 * t + (e & 1), row = c.row0 + col;
          const int key_slot = slot_base + 8 * (e >> 1);
          const float l = (e & 1) ? lse.y : lse.x;
          const bool vis = kAllVisible || (l != -CUDART_INF_F &&
                                           sched.visible(row, k0 + key_slot, key_slot, n_keys));
          st[j][e] = vis ? fast_exp2(fmaf(st[j][e], p.scale_log2, -l)) : 0.0f;
        }
      }
    };
    if (sched.tile_all_visible(c.row0, n_keys, p.Sq)) {
      probabilities(std::true_type{});
    } else {
      probabilities(std::false_type{});
    }
    wgmma_wait<0>();  // dPᵀ
    fence_registers(dpt_flat);

    // dSᵀ = dtype(Pᵀ (dPᵀ - Delta)) from the unquantized Pᵀ.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 delta = *reinterpret_cast<const float2*>(stats + 64 + j * 8 + 2 * t);
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[e] = st[j][e] * (dpt[j][e] - ((e & 1) ? delta.y : delta.x));
      pack_a_tile<T>(a_ds, j, ds);
    }
    // What dV multiplies: FQ_P(P), block scales (a group: this warp's 16 keys of one query
    // column), or P itself.
    if (kQuantizeP && p.quantize_p) {
      fake_quantize_columns_block<T>(st, a_p);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) pack_a_tile<T>(a_p, j, st[j]);
    }
    // dV += Pᵀ dO and dK += dSᵀ Q: k16 steps over the tile's queries (16 rows, 2048 bytes each) of
    // the MN-major dO and Q tiles.
    const uint64_t do_desc = smem_descriptor(do_tile(stage), L::kRegionBytes, 1024);
    const uint64_t q_desc = smem_descriptor(q_tile(stage), L::kRegionBytes, 1024);
    wgmma_fence();
#pragma unroll
    for (int step = 0; step < 4; ++step) {
      wgmma_rs_mn<T, D>(dv, a_p[step], smem_descriptor_advance(do_desc, step * 2048));
      wgmma_rs_mn<T, D>(dk, a_ds[step], smem_descriptor_advance(q_desc, step * 2048));
    }
    wgmma_commit();
    // dV and dK stay in flight under the next tile's Sᵀ; the stage they read is released after
    // the wait that covers them (the next tile's, or the one below).
    pending = stage;
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
  wgmma_wait<0>();
  fence_registers(dk);
  fence_registers(dv);
  keep_alive();

  // dK * scale and dV, rows past the tile's output rows left alone.
  const int rows = sched.output_rows();
  E* dkg = static_cast<E*>(p.dk.data) + b * p.dk.stride_b + hk * p.dk.stride_h;
  E* dvg = static_cast<E*>(p.dv.data) + b * p.dv.stride_b + hk * p.dv.stride_h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int slot = slot_base + 8 * r;
    if (slot >= rows) continue;
    const int64_t key = k0 + slot;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int col = j * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(dkg + key * p.dk.stride_s + col) =
          T::pack(p.scale * dk[4 * j + 2 * r], p.scale * dk[4 * j + 2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dvg + key * p.dv.stride_s + col) =
          T::pack(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
    }
  }
}

}  // namespace fva::dev::sm90
