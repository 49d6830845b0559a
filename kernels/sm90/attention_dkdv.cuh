// The Hopper-native dK/dV kernel (sm_90a) of the attention backward, shared by QAT attention and
// VSA; the Delta pass stays portable. A block owns 64 keys (or 128, fused below) and walks the
// 64-row query tiles its schedule lists (QAT: every query tile that sees the keys, the GQA group's
// heads in turn; VSA: the q blocks of the kv block's inverse list, ascending), so dK and dV are
// fixed-order sums: bitwise reproducible on every handle.
//   - a producer warp streams (Q, dO) tile pairs through a kStages ring with the TMA, after loading
//     K and V once, and copies each tile's lse and Delta beside them;
//   - a consumer warpgroup per 64 keys computes, per query tile,
//         Sᵀ = K Qᵀ, dPᵀ = V dOᵀ (wgmma, shared-memory operands)
//         Pᵀ = 2^(Sᵀ scale log2e - lse) (masked: 0), dSᵀ = dtype(Pᵀ (dPᵀ - Delta))
//         dV += [FQ_P](Pᵀ) dO, dK += dSᵀ Q (wgmma, P and dS from registers)
//     and finally stores dK * scale and dV. Two such blocks share an SM, interleaving one's
//     exponentials with the other's products; a dQ kernel follows.
//   - kStoreDs (the default within the workspace budget, both backwards, every handle): each
//     pair's dSᵀ also goes to the workspace as it sits in the registers (8 KiB, fully coalesced
//     stores, issued during the next tile), and the dQ kernel of sm90/attention_dq_from_ds.cuh
//     sums dS K from it. Without it, the dQ kernel of sm90/attention_dq.cuh recomputes S and dP.
//   - kFuseDq (QAT at D = 128, handles that are not deterministic, beyond the stored-dS budget):
//     dQ is computed here instead,
//     FlashAttention-3's way. A block owns 128 keys, two consumers of 64 (one block per SM). Each
//     writes its dSᵀ to shared memory (dK reads it from there), and computes one 64-column half of
//     the query tile's dQ part, dS K over all 128 keys (and rowsum(dS), dS against ones, for
//     smooth-K), which it adds into the fp32 accumulator in the workspace
//     (sm90/dq_accumulator.cuh); a convert kernel writes dQ. That saves the dQ kernel's recomputed
//     S and dP (7 products per pair become 5). The dS tiles go through two buffers with mbarriers,
//     and each consumer computes a tile's dQ half while working on the next tile, so the two are
//     not held in step. Why 128 keys: the reductions are L2-bound (tools/device/reduce_probe.cu:
//     2.5 TB/s on the H200), and a 64-key block's 32 KiB per pair cost more than the dQ kernel.
// QAT's FQ_P groups are 16 keys of one query column: the 8 quads of a warp (column_max), as in the
// portable kernel; only block P scales run here (tile and row scales stay on the portable kernel).
#pragma once

#include <math_constants.h>

#include <type_traits>

#include "shared/kernel_params.h"
#include "primitives/online_softmax.cuh"
#include "sm90/dq_accumulator.cuh"
#include "sm90/query_stream.cuh"  // zero_tile_rows, RegisterSplit

namespace fva::dev::sm90 {

template <int D, int kStages, bool kFuseDq>
struct BackwardLayout {
  static constexpr int kConsumers = kFuseDq ? 2 : 1;  // 64-key tiles per block
  static constexpr int kRegionBytes = 64 * 128;
  static constexpr int kRegions = D / 64;
  static constexpr int kTileBytes = kRegions * kRegionBytes;  // 64 rows x D
  static constexpr int kK = 0;                                 // consumer w's K: kK + w tiles
  static constexpr int kV = kConsumers * kTileBytes;           // consumer w's V: kV + w tiles
  static constexpr int kQ = 2 * kConsumers * kTileBytes;       // stage s: Q at kQ + 2s tiles
  // kFuseDq: dSᵀ in two buffers (query tiles alternate), each per consumer 64 keys x 64 queries
  // in one swizzled region (buffer u, consumer w: kDs + (u kConsumers + w) regions, so a buffer
  // holds the block's 128 keys of dS in order), and 16 x 64 16-bit ones.
  static constexpr int kDs = kQ + 2 * kStages * kTileBytes;
  static constexpr int kOnes = kDs + (kFuseDq ? 2 * kConsumers * kRegionBytes : 0);
  static constexpr int kRowStats = kOnes + (kFuseDq ? 2048 : 0);  // stage s: lse[64], Delta[64]
  static constexpr int kTiles = kRowStats + kStages * 2 * 64 * 4;  // stage s: its StagedTile
  static constexpr int kBarriers = kTiles + kStages * 16;
  static_assert(kern::sm90_dkdv_smem_bytes(D, kStages, kFuseDq) ==
                    kBarriers + 8 * (1 + 2 * kStages + (kFuseDq ? 4 : 0)),
                "host and device disagree on the shared-memory layout");
};

// dSᵀ from its A fragments (a[step]: keys slot_base + {0, 8} x queries 16 step + 8 (i / 2) + 2t
// + {0, 1}) into a 64 x 64 16-bit tile, a key per 128-byte row, 16-byte chunks swizzled by the row
// (128-byte swizzle): read MN-major, it is dS, the A operand of dQ = dS K. A warp's stores of one
// register hit 8 rows with 8 different chunks: no bank conflicts.
__device__ __forceinline__ void store_ds_transposed(uint32_t tile, const uint32_t (&a)[4][4],
                                                    int slot_base, int t) {
#pragma unroll
  for (int step = 0; step < 4; ++step)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = slot_base + 8 * (i & 1), chunk = 2 * step + (i >> 1);
      st_shared_u32(swizzled_chunk_128b(tile, row, row & 7, chunk) + 4 * t, a[step][i]);
    }
}

// A query tile as the producer hands it to the consumers, beside its lse and Delta in the stage:
// the schedule's cursor reduced to what the consumers use. The consumers read it from shared
// memory instead of walking the schedule themselves: VSA's cursor reads the inverse lists (four
// dependent global loads per tile), which delayed each tile's first product in the consumer
// (about a tenth of the kernel's stall samples, tools/device/sass_hotspots.sh, session 13); the
// producer runs stages ahead, so the loads cost it nothing. head < 0 ends the stream. ds_tile
// (kStoreDs): the pair's dS tile in P.ds_tiles, whose index arithmetic the producer does too.
struct StagedTile {
  int head, row0;
  int64_t ds_tile;
  __device__ __forceinline__ bool valid() const { return head >= 0; }
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

// Where a pair's dSᵀ goes with kStoreDs: its tile's 4096 elements as this warpgroup holds them, 16
// bytes per thread and k16 step (a_ds[step]), warp w's step s at uint4 (4 w + s) 32 + lane, so
// each store of a warp writes 512 contiguous bytes. sm90/attention_dq_from_ds.cuh reads them back.
__device__ __forceinline__ void store_ds_tile(uint4* tile, const uint32_t (&a)[4][4], int warp,
                                              int lane) {
#pragma unroll
  for (int step = 0; step < 4; ++step)
    tile[(4 * warp + step) * 32 + lane] = make_uint4(a[step][0], a[step][1], a[step][2], a[step][3]);
}

// kDeferDs (with kStoreDs): a tile's dS stores wait for the next tile (store_pending_ds). Measured
// on one H200 in one run (docs/perf.md, session 9): VSA +3% at S=16384 with it, QAT +1.4% at 32768
// without it (QAT's consumer does more arithmetic per tile, FQ_P, under which the stores hide).
template <typename T, int D, typename Schedule, bool kQuantizeP, int kStages, bool kFuseDq,
          bool kStoreDs = false, bool kDeferDs = !Schedule::kMayQuantizeP>
__device__ __forceinline__ void attention_backward_dkdv_sm90(const kern::Sm90BackwardParams& P,
                                                             char* smem) {
  using L = BackwardLayout<D, kStages, kFuseDq>;
  constexpr int kConsumers = L::kConsumers;
  // The fused kernel: two consumers, each 64 keys and, of dQ = dS K over the block's 128 keys, one
  // 64-column half of D. QAT only: its keys past Skv are zeros from the TMA (a ragged VSA block's
  // padding rows would need zeroing, which runs on one warpgroup's barrier).
  static_assert(!kFuseDq || (D == 128 && Schedule::kMayQuantizeP),
                "the fused dQ kernel covers QAT at D = 128");
  // kStoreDs: every pair's dS tile goes to P.ds_tiles for the dQ kernel, which then needs no S
  // and dP of its own (sm90/attention_dq_from_ds.cuh).
  static_assert(!kStoreDs || !kFuseDq, "dQ comes from stored dS or from the fused reductions");
  using E = typename T::Storage;
  const kern::AttentionParams& p = P.a;

  const uint32_t base = smem_addr(smem);
  if (base & 1023) __trap();
  const uint32_t bar_kv = base + L::kBarriers;
  auto bar_full = [&](int s) { return bar_kv + 8 * (1 + s); };
  auto bar_empty = [&](int s) { return bar_kv + 8 * (1 + kStages + s); };
  // kFuseDq, per dS buffer u: full once both consumers wrote their dSᵀ (arrivals: every consumer
  // thread), empty once both read it (their dK and dQ products are complete).
  auto ds_full = [&](int u) { return bar_kv + 8 * (1 + 2 * kStages + u); };
  auto ds_empty = [&](int u) { return bar_kv + 8 * (3 + 2 * kStages + u); };
  auto ds_region = [&](int u, int w) {
    return base + L::kDs + (u * kConsumers + w) * L::kRegionBytes;
  };
  auto q_tile = [&](int s) { return base + L::kQ + 2 * s * L::kTileBytes; };
  auto do_tile = [&](int s) { return base + L::kQ + (2 * s + 1) * L::kTileBytes; };

  const int warpgroup = threadIdx.x / 128;
  const int bh = blockIdx.y + (kStoreDs ? P.kv_unit0 : 0);  // stored dS: a chunk of the units
  const int b = bh / p.Hkv, hk = bh % p.Hkv;
  // The block's first key (VSA: its kv block in the inverse's order, longest lists first).
  const int k0 = Schedule::key_block(p, bh, blockIdx.x) * 64 * kConsumers;
  const Schedule sched(p, b, hk, k0);             // the query tiles the block walks
  const QueryTiles64<Schedule> tiles{sched};

  // Per stage, lse and Delta of the tile's 64 rows (-inf and 0 past Sq), written by the producer's
  // first warp with plain stores; its 32 arrivals (release) join the TMA's on the full barrier.
  float* row_stats = reinterpret_cast<float*>(smem + L::kRowStats);
  StagedTile* staged = reinterpret_cast<StagedTile*>(smem + L::kTiles);

  if (threadIdx.x == 0) {
    mbar_init(bar_kv, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full(s), 1 + 32);
      // Every consumer thread arrives: each has read the stage's lse/Delta with plain loads, and
      // its own arrival (release) is what orders those reads before the producer's next stores.
      mbar_init(bar_empty(s), 128 * kConsumers);
    }
    if (kFuseDq) {
      for (int u = 0; u < 2; ++u) {
        mbar_init(ds_full(u), 128 * kConsumers);
        mbar_init(ds_empty(u), 128 * kConsumers);
      }
    }
    mbar_fence_init();
  }
  if (kFuseDq) fill_ones_tile<T>(base + L::kOnes);
  __syncthreads();

  if (warpgroup == 0) {
    // ---- producer ------------------------------------------------------------------------------
    setmaxnreg_dec<RegisterSplit<kConsumers>::kProducer>();
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      if (lane == 0) {
        tma_prefetch_descriptor(&P.q);
        tma_prefetch_descriptor(&P.dout);
        mbar_arrive_expect_tx(bar_kv, 2 * kConsumers * L::kTileBytes);
        for (int w = 0; w < kConsumers; ++w)
          for (int r = 0; r < L::kRegions; ++r) {
            const int at = w * L::kTileBytes + r * L::kRegionBytes;
            tma_load_4d(base + L::kK + at, &P.k, bar_kv, 64 * r, k0 + 64 * w, hk, b);
            tma_load_4d(base + L::kV + at, &P.v, bar_kv, 64 * r, k0 + 64 * w, hk, b);
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
        mbar_arrive(bar_full(stage));
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
      // The end of the stream: a stage without loads whose tile is not valid (lane 0's plain
      // arrival stands for the TMA's).
      mbar_wait(bar_empty(stage), phase ^ 1);
      if (lane == 0) {
        staged[stage] = StagedTile{-1, 0, 0};
        mbar_arrive(bar_full(stage));
      }
      mbar_arrive(bar_full(stage));
    }
    return;
  }

  // ---- consumer ---------------------------------------------------------------------------------
  setmaxnreg_inc<RegisterSplit<kConsumers>::kConsumer>();
  const int consumer = kConsumers == 1 ? 0 : warpgroup - 1;  // a constant when it can be
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int slot_base = warp * 16 + g;  // this thread's keys: slot_base, slot_base + 8
  // This consumer's 64 keys from kc0: their visibility, count (at most 0 past Skv) and outputs.
  const int kc0 = k0 + 64 * consumer;
  const Schedule second(p, b, hk, kc0);
  const Schedule& keys = kConsumers == 1 ? sched : second;  // one consumer: the block's schedule
  const int n_keys = keys.valid_keys();
  const uint32_t k_tile = base + L::kK + consumer * L::kTileBytes;
  const uint32_t v_tile = base + L::kV + consumer * L::kTileBytes;
  // kFuseDq: the query tiles this consumer has finished, and the last one (its dQ part
  // runs one tile late, see below).
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
  auto keep_alive = [&]() {
    keep_operands_alive(a_p);
    if constexpr (!kFuseDq) keep_operands_alive(a_ds);  // fused: dK reads dSᵀ from shared memory
  };

  mbar_wait(bar_kv, 0);
  if (kConsumers == 1 && n_keys < 64) {
    // A ragged VSA block: its padding slots hold the caller's data (NaN included), which dPᵀ would
    // carry into dS through 0 * NaN; zero those rows of K and V. (QAT's keys past Skv are outside
    // the tensor: the TMA already filled them with zeros. The two-consumer kernel is QAT's.)
    zero_tile_rows<L::kRegions>(base + L::kK, n_keys, tid);
    zero_tile_rows<L::kRegions>(base + L::kV, n_keys, tid);
  }

  // Per query tile: Sᵀ, then dPᵀ (issued once the previous tile's dV/dK are done, which frees their
  // operand registers) -> Pᵀ from Sᵀ while dPᵀ runs -> dSᵀ, FQ_P(Pᵀ) -> dV and dK, which stay in
  // flight under the next tile's Sᵀ. (dV issued before dSᵀ, to run under it, with FQ_P under dPᵀ
  // measured slower, 6.9 against 5.6 ms for QAT's dK/dV at S=16384: with those accumulators in
  // flight beside the arithmetic's registers, ptxas serializes the wgmma, C7512.)
  // kFuseDq: this consumer's half of dQ = dS K for the block's `index`-th query tile (columns
  // 64 consumer ... + 63 of D) over the block's 128 keys: 8 k16 steps, 16 keys each, of dS (both
  // consumers' dSᵀ in the tile's buffer, in key order, 2048 bytes a step) and of K (the first
  // consumer's tile, then the second's), both read MN-major; and rowsum(dS), dS against ones (both
  // consumers issue it: a wgmma under a branch makes ptxas insert waits, C7519; consumer 0
  // reduces it). finish_dq, after the wait that covers them, reduces them for the tile's cursor.
  [[maybe_unused]] auto issue_dq = [&](int index) {
    const int u = index & 1;
    mbar_wait(ds_full(u), (index >> 1) & 1);
    const uint64_t ds_desc = mnmajor_tile_descriptor(ds_region(u, 0));
    const uint64_t ones_desc = mnmajor_tile_descriptor(base + L::kOnes);
    const uint64_t k_desc =
        mnmajor_tile_descriptor(base + L::kK + consumer * L::kRegionBytes);
    wgmma_fence();
#pragma unroll
    for (int step = 0; step < 4 * kConsumers; ++step) {
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
  };
  [[maybe_unused]] auto finish_dq = [&](const StagedTile& q) {
    fence_registers(dq);
    fence_registers(ds_sum);
    const int bhq = b * p.Hq + q.head, q_tile_index = q.row0 / 64;  // the query tile's (b, h)
    if (consumer == 0 && p.k_mean != nullptr)
      reduce_row_sums(ds_rowsum_tile(P, bhq, q_tile_index), ds_sum, warp, lane);
    reduce_dq_fragments<D>(dq_accumulator_tile<D>(P, bhq, q_tile_index), dq, consumer, warp, lane);
  };

  int stage = 0, pending = -1;
  uint32_t phase = 0;
  // kStoreDs: the tile (its index in P.ds_tiles) whose dSᵀ, still in a_ds, is stored next; see
  // store_pending_ds.
  [[maybe_unused]] int64_t ds_pending = -1;
  // kDeferDs: a tile's dSᵀ is stored during the next tile, after that tile's release of its
  // predecessor's stage (an mbarrier arrive, with release semantics), not just before it: a
  // release orders the stores before it, and waiting for them there can stall the consumer.
  [[maybe_unused]] auto store_pending_ds = [&] {
    if constexpr (kStoreDs && kDeferDs) {
      if (ds_pending >= 0)
        store_ds_tile(static_cast<uint4*>(P.ds_tiles) + ds_pending * (kern::sm90_ds_tile_bytes / 16),
                      a_ds, warp, lane);
      ds_pending = -1;
    }
  };
  for (;;) {
    mbar_wait(bar_full(stage), phase);
    const StagedTile c = staged[stage];
    if (!c.valid()) break;
    wgmma_fence();
    wgmma_tiles_abt<T, D>(st_flat, k_tile, q_tile(stage));
    wgmma_commit();
    // The previous tile's dV/dK products (committed before this tile's Sᵀ, so done first): their
    // stage goes back to the producer.
    wgmma_wait<1>();
    fence_registers(dk);
    fence_registers(dv);
    keep_alive();
    if (pending >= 0) mbar_arrive(bar_empty(pending));
    if constexpr (kDeferDs) store_pending_ds();
    wgmma_fence();
    wgmma_tiles_abt<T, D>(dpt_flat, v_tile, do_tile(stage));
    wgmma_commit();
    // The tile's lse, read while Sᵀ finishes: loaded after the wait, the first exponential waited
    // for them (5% of the dkdvs' stall samples, tools/device/sass_hotspots.sh).
    const float* stats = row_stats + stage * 128;
    float2 lse_of[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) lse_of[j] = *reinterpret_cast<const float2*>(stats + j * 8 + 2 * t);
    wgmma_wait<1>();  // Sᵀ (dPᵀ stays in flight)
    fence_registers(st_flat);

    // Pᵀ (masked entries 0); this thread's query columns of the tile are 8j + 2t + {0, 1}. A tile
    // the schedule says is wholly visible (kAllVisible) is compiled without the per-element checks
    // (about 5 integer and predicate instructions per element).
    auto probabilities = [&](auto all_visible) {
      constexpr bool kAllVisible = decltype(all_visible)::value;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 lse = lse_of[j];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = j * 8 + 2 * t + (e & 1), row = c.row0 + col;
          const int key_slot = slot_base + 8 * (e >> 1);
          const float l = (e & 1) ? lse.y : lse.x;
          const bool vis = kAllVisible || (l != -CUDART_INF_F &&
                                           keys.visible(row, kc0 + key_slot, key_slot, n_keys));
          st[j][e] = vis ? fast_exp2(fmaf(st[j][e], p.scale_log2, -l)) : 0.0f;
        }
      }
    };
    if (keys.tile_all_visible(c.row0, n_keys, p.Sq)) {
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
    if constexpr (kFuseDq) {
      // dSᵀ to this tile's buffer, once both consumers have read what it held two tiles ago.
      const int u = done & 1;
      mbar_wait(ds_empty(u), ((done >> 1) & 1) ^ 1);
      store_ds_transposed(ds_region(u, consumer), a_ds, slot_base, t);
      fence_proxy_async();
      mbar_arrive(ds_full(u));
    }
    // dV += Pᵀ dO and dK += dSᵀ Q: k16 steps over the tile's queries (16 rows, 2048 bytes each) of
    // the MN-major dO and Q tiles.
    // Fused: dSᵀ, the A operand of dK, comes from the shared-memory tile dQ reads (K-major: the 4
    // k16 steps are 32 bytes apart in its 128-byte rows), which frees its registers.
    auto issue_dv_dk = [&] {
      const uint64_t do_desc = mnmajor_tile_descriptor(do_tile(stage));
      const uint64_t q_desc = mnmajor_tile_descriptor(q_tile(stage));
      [[maybe_unused]] const uint64_t ds_desc =
          kmajor_tile_descriptor(ds_region(done & 1, consumer));
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
    };
    if constexpr (kFuseDq) {
      // dV and dK, then this consumer's half of the previous query tile's dQ part (its dS is
      // complete unless the other consumer is a whole tile behind, so the two consumers are not
      // held in step); one wait covers them, then the half is reduced into the accumulator and
      // the previous tile's dS buffer is released. (Reducing while dV and dK are in flight, or a
      // dQ accumulator as wide as D, makes ptxas spill and serialize the wgmma, C7512: dK and dV
      // hold 128 registers.)
      issue_dv_dk();
      if (last.valid()) {
        issue_dq(done - 1);
        wgmma_wait<0>();
        finish_dq(last);
        mbar_arrive(ds_empty((done - 1) & 1));
      } else {
        wgmma_wait<0>();
      }
      last = c;
      ++done;
    } else {
      issue_dv_dk();
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
      mbar_arrive(bar_empty(stage));
    } else {
      pending = stage;
    }
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
  if constexpr (kFuseDq) {
    if (last.valid()) {  // the last query tile's dQ part
      issue_dq(done - 1);
      wgmma_wait<0>();
      finish_dq(last);
    }
  }
  wgmma_wait<0>();
  fence_registers(dk);
  fence_registers(dv);
  keep_alive();
  if constexpr (kDeferDs) store_pending_ds();  // the last tile's

  // dK * scale and dV, rows past the tile's output rows left alone.
  const int rows = keys.output_rows();
  E* dkg = static_cast<E*>(p.dk.data) + b * p.dk.stride_b + hk * p.dk.stride_h;
  E* dvg = static_cast<E*>(p.dv.data) + b * p.dv.stride_b + hk * p.dv.stride_h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int slot = slot_base + 8 * r;
    if (slot >= rows) continue;
    const int64_t key = kc0 + slot;
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
