// The Hopper-native QAT attention forward (sm_90a), built the way FlashAttention-3 builds its
// Hopper kernels:
//   - a producer warpgroup (one elected thread) streams Q once and then K and V tiles of 64 keys
//     through a kStages-deep shared-memory ring with the TMA, in the schedule's order (key tiles
//     0, 1, ...);
//   - kConsumers consumer warpgroups each own 64 query rows and run, per key tile,
//         S = Q Kᵀ (wgmma, both operands in shared memory) -> mask -> online softmax -> P·V (wgmma,
//         P from registers, V in shared memory): both P·V products, FQ_P(P) and P;
//   - setmaxnreg moves registers from the producer to the consumers.
// Two consumers share every K/V tile (128 query rows per block: half the L2 traffic per FLOP).
// Within a consumer, a key tile is S (wgmma), then the tile's maxima (the running max advances per
// 32-key sub-tile, as in the CPU reference, see attention_forward.cuh) and NVFP4 scales while the
// previous tile's P·V runs, then both sub-tiles' exponentials and FQ_P, whose P·V is issued in one
// go (session 18: +3-8.5% over a P·V per sub-tile) right after the next tile's S. With quantized P,
// K and V tiles are in the owned-group key order (shared/key_order.h): each lane's 16 columns of a
// row are one NVFP4 group, so the groups' maxima and scales need no exchange (session 19: 550 ->
// 512 instructions per warp and tile; alone, no faster, since the turn bound). The accumulators
// are relative to a lazy reference max (primitives/online_softmax.cuh's tile softmaxes): a rescale is rare,
// once per tile before its operands, and each warp's own choice. Session 15 (docs/perf.md) took
// the kernel from 737 to 598 instructions per warp and tile and 289 to 347 TFLOPS at S=16384.
// The two consumers ping-pong (FlashAttention-3's schedule, named barriers): each in turn issues
// {its next tile's S, its tile's P·V} (session 17: +1.1-1.5% with the P·V first; session 19: S
// first, waited for alone, +3.0% / +3.9% on top of the owned groups; without any ping-pong,
// -13% / -8%).
// Measured and not kept (docs/perf.md): FlashAttention-3's intra-warpgroup overlap (the softmax
// of one tile under the next S; VSA 325 against 369 TFLOPS when VSA ran here; QAT, with the
// softmax's exponentials under the previous P·V, 277.7 against 286.8 at S=16384, branch
// exp/overlap-s7; session 17, S first with a P·V per sub-tile: within the spread, branch
// exp/early-s-s17). The softmax's NVFP4 arithmetic, latency-bound with two consumer warps per
// scheduler, and the turns between the consumers, not the tensor pipe, bound this kernel.
// VSA's forward is sm90/attention_forward_compact.cuh: its q blocks share no K/V tiles, and four
// producer-less blocks per SM beat two warp-specialized ones.
//
// The grid is one-dimensional; the tiles of its last, partial wave may be split over their key
// tiles, the pieces merging through the workspace (sm90/forward_split.cuh: the kernel 1.3%
// faster at S=32768 with quantized P, plain attention +0.6% / +1.7%, session 26).
// Where the host launches it in clusters of two (P.cluster: not causal, an even count of query
// tiles per head), the two blocks run neighbouring query tiles of one head over the same key
// tiles, and their producers split the loads, each multicasting half of every stage into both
// rings (sm90/query_stream.cuh): FlashAttention-3's clusters for its non-causal D >= 128 forward.
// The L2 then serves each K/V tile once per 256 query rows instead of per 128 (34 GB less L2
// traffic per call at S=32768); the math is the same, bit for bit.
// Layout and instruction notes: primitives/sm90.cuh; the shared-memory ring and its producer:
// sm90/query_stream.cuh (the query tiles are Q, one per consumer).
#pragma once

#include <math_constants.h>

#include <type_traits>

#include "shared/kernel_params.h"
#include "shared/key_order.h"
#include "primitives/online_softmax.cuh"
#include "sm90/forward_split.cuh"
#include "sm90/query_stream.cuh"

namespace fva::dev::sm90 {

// The row's log-sum-exp (base 2, of the scaled logits), -inf for a row that saw no key.
__device__ __forceinline__ void store_row_lse(const kern::AttentionParams& p, int b, int h, int row,
                                              float m, float l) {
  p.lse.data[b * p.lse.stride_b + h * p.lse.stride_h + row * p.lse.stride_s] =
      l > 0.0f ? m + log2f(l) : -CUDART_INF_F;
}

// The forward's epilogue for a thread's two rows (row_base, row_base + 8; columns 8j + 2t + {0, 1}):
// o = acc / l (and o_hp), lse = m + log2(l); a row without a visible key (VSA) gets o = 0 and
// lse = -inf. Rows past Sq are not written.
// The division is acc * (1 / l), one reciprocal per row as FlashAttention's epilogues do: within two
// ulps of the element-wise division in fp32, before the dtype's rounding (SPEC's tolerances hold).
// The division's ~10 instructions per element (reciprocal, five FMAs, a range check and its
// branch) were, in the VSA forward, whose 64-row q blocks end after a few dozen key tiles, as many
// instructions per block as about four tiles: +1.1% there, +1.6% for the QAT forward at S=16384
// (docs/perf.md, session 22).
template <typename T, int D, bool kQuantizeP>
__device__ __forceinline__ void store_forward_outputs(const kern::AttentionParams& p, int b, int h,
                                                      int row_base, int t, const float (&o)[D / 2],
                                                      const float (&o_hp)[kQuantizeP ? D / 2 : 1],
                                                      const float (&m)[2], const float (&l)[2]) {
  using E = typename T::Storage;
  E* og = static_cast<E*>(p.o.data) + b * p.o.stride_b + h * p.o.stride_h;
  E* hg = p.o_hp.data != nullptr
              ? static_cast<E*>(p.o_hp.data) + b * p.o_hp.stride_b + h * p.o_hp.stride_h
              : nullptr;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_base + 8 * r;
    if (row >= p.Sq) continue;
    const bool any = l[r] > 0.0f;
    const float inv = any ? __frcp_rn(l[r]) : 0.0f;  // o = 0 where l = 0 (acc is 0 there)
    auto normalized = [&](float acc) { return acc * inv; };
    // The row's column pairs, one 4-byte store each, 16 bytes apart per n8 block: one address per
    // row, the rest immediate offsets.
    uint32_t* o_row = reinterpret_cast<uint32_t*>(og + row * p.o.stride_s + 2 * t);
    uint32_t* hp_row =
        hg != nullptr ? reinterpret_cast<uint32_t*>(hg + row * p.o_hp.stride_s + 2 * t) : nullptr;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const float a = normalized(o[4 * j + 2 * r]);
      const float bb = normalized(o[4 * j + 2 * r + 1]);
      o_row[4 * j] = T::pack(a, bb);
      if (hp_row != nullptr) {
        float ha = a, hb = bb;
        if constexpr (kQuantizeP) {
          ha = normalized(o_hp[4 * j + 2 * r]);
          hb = normalized(o_hp[4 * j + 2 * r + 1]);
        }
        hp_row[4 * j] = T::pack(ha, hb);
      }
    }
    if (t == 0) store_row_lse(p, b, h, row, m[r], l[r]);
  }
}

template <typename T, int D, typename Schedule, bool kQuantizeP, int kConsumers, int kStages>
__device__ __forceinline__ void attention_forward_sm90(const kern::Sm90ForwardParams& P,
                                                       char* smem) {
  using L = QueryStreamLayout<D, kConsumers, kStages>;
  static_assert(!Schedule::kPaddedBlocks,
                "ragged (VSA) blocks need their V padding zeroed: sm90/attention_forward_compact.cuh");
  static_assert(Schedule::kSubTile == 32, "the tile softmaxes: 32-key softmax sub-tiles");
  constexpr int kSubTiles = 64 / Schedule::kSubTile;
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
  // A cluster of two (P.cluster, the launch's): the blocks share their K/V loads
  // (sm90/query_stream.cuh), so each stage's release goes to both blocks' barriers, and no block
  // exits before its partner is done arriving on its barriers (the cluster barrier at the end).
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
    // ---- producer ------------------------------------------------------------------------------
    setmaxnreg_dec<RegisterSplit<kConsumers>::kProducer>();
    if (threadIdx.x == 0) {
      const kern::TensorMap* const query[1] = {&P.q};
      ring.template produce<kConsumers>(query, &P.k, &P.v, sched, q0, h, hk, b, keys_first,
                                        cluster, rank);
    }
    if (cluster > 1) {
      cluster_arrive();
      cluster_wait();
    }
    return;
  }

  // ---- consumers --------------------------------------------------------------------------------
  setmaxnreg_inc<RegisterSplit<kConsumers>::kConsumer>();
  const int c = __shfl_sync(0xffffffffu, warpgroup, 0) - 1;  // warp-uniform, as the compiler sees it
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = q0 + 64 * c;                  // this consumer's first row
  const int last_row = min(p.Sq, row0 + 64) - 1;  // < row0: every row is past Sq
  const int row_base = row0 + 16 * warp + g;      // this thread's rows: row_base, row_base + 8
  const uint32_t q_tile = ring.query_tile(c);
  // Tiles below unmasked_end need no mask; from compute_end on, no row of this consumer sees a key
  // (causal; or every row is past Sq).
  const int unmasked_end = sched.unmasked_end(row0);
  const int compute_end = last_row >= row0 ? sched.visible_end(last_row) : 0;

  // o_hp: P·[V | ones], the dtype-rounded P's product (the output itself without quantization),
  // with the rows' sums l in its last n8 block (registers D / 2 .. D / 2 + 3: every column holds
  // its row's sum; l sums bf16(p), the operand P·V reads, as SPEC defines l). The sums ride on
  // P·V's own wgmma (N = D + 8 against V's stage and a region of ones after it) and are rescaled
  // with o. o: FQ_P(P)·V (kQuantizeP).
  constexpr int kHp = D / 2 + 4;
  float o[kQuantizeP ? D / 2 : 1], o_hp[kHp];
#pragma unroll
  for (int i = 0; i < kHp; ++i) o_hp[i] = 0.0f;
  if constexpr (kQuantizeP) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  }
  // The running max (FQ_P's, SPEC.md) and the reference o, o_hp and l are kept relative to
  // (LazyTileSoftmax and OwnedGroupTileSoftmax, primitives/online_softmax.cuh).
  float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F}, m_ref[2] = {-CUDART_INF_F, -CUDART_INF_F};
  // S of one key tile, and P (and FQ_P(P)) of its 4 k16 steps as A operands of P·V. The A
  // registers are read by the tensor cores after the issuing instruction, so each is kept alive
  // (keep_alive) until the wait that covers its P·V: otherwise the compiler could reuse them.
  float s[8][4];
  float(&s_flat)[32] = reinterpret_cast<float(&)[32]>(s);
  uint32_t a_hp[4][4], a_q[kQuantizeP ? 4 : 1][4];
  // Quantized P: K and V tiles in the owned-group key order (shared/key_order.h), each lane's NVFP4
  // groups its own.
  using Softmax =
      std::conditional_t<kQuantizeP, OwnedGroupTileSoftmax<T>, LazyTileSoftmax<T, kSubTiles>>;

  // The products' shared-memory descriptors, built outside the turn (session 35: the QAT forward
  // +1.3% / +1.6%). A stage's address goes through a shuffle (warp-uniform as the compiler sees it:
  // the descriptors live in uniform registers), and each descriptor through opaque64 where it is
  // built, so that the compiler cannot rebuild it later. Without it the descriptors were built
  // after the turn's barrier, a chain of dependent uniform instructions before the first wgmma
  // while the other consumer waited for the turn; the loop builds them before the tile's K wait,
  // and its turn starts with 4 moves and the wgmma fence (SASS, session 35).
  const uint64_t q_desc = opaque64(kmajor_tile_descriptor(q_tile));
  auto k_desc = [&](int st) {
    return opaque64(kmajor_tile_descriptor(ring.k_tile(__shfl_sync(0xffffffffu, st, 0))));
  };
  auto v_desc = [&](int st) {
    return opaque64(mnmajor_tile_descriptor(ring.v_tile(__shfl_sync(0xffffffffu, st, 0))));
  };
  auto keep_alive = [&]() {
    keep_operands_alive(a_hp);
    if constexpr (kQuantizeP) keep_operands_alive(a_q);
  };
  auto fence_accumulators = [&]() {
    if constexpr (kQuantizeP) fence_registers(o);
    fence_registers(o_hp);
  };
  // S = Q Kᵀ: D / 16 k16 steps, 32 bytes apart within a 128-byte row, 4 steps per region.
  auto issue_s = [&](uint64_t k) {
    wgmma_fence();
    wgmma_tiles_abt_desc<T, D>(s_flat, q_desc, k);
    wgmma_commit();
  };
  auto apply_mask = [&](int tile) {
    if (tile < unmasked_end) return;  // the whole 64 x 64 tile is visible
    const int k0 = sched.key0(tile), n_valid = sched.valid_keys(tile);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int slot = j * 8 + 2 * t + (e & 1);
        const int key = kQuantizeP ? key_of_owned_slot(slot) : slot;  // the tile's key order
        if (!sched.visible(row_base + 8 * (e >> 1), k0 + key, key, n_valid))
          s[j][e] = Schedule::kMaskedLogit;
      }
  };
  // o *= alpha per row. The accumulators must be complete (waited for).
  auto rescale = [&](const float (&alpha)[2]) {
    fence_accumulators();
#pragma unroll
    for (int i = 0; i < kHp; ++i) o_hp[i] *= alpha[(i >> 1) & 1];  // l too (D / 2 % 4 == 0)
    if constexpr (kQuantizeP) {
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
  };
  // P·V over k16 steps [first, first + count) of the tile's 64 keys (16 keys, 2048 bytes each),
  // from V's descriptor (v_desc).
  auto issue_pv = [&](uint64_t v_base, int first, int count) {
    wgmma_fence();
#pragma unroll
    for (int step = first; step < first + count; ++step) {
      const uint64_t v_desc = smem_descriptor_advance(v_base, step * 2048);
      if constexpr (kQuantizeP) wgmma_rs_mn<T, D>(o, a_q[step], v_desc);
      wgmma_rs_mn<T, D + 8>(o_hp, a_hp[step], v_desc);  // V's D columns, then 8 of ones
    }
    wgmma_commit();
  };
  mbar_wait(ring.bar_query(), 0);
  int stage = 0;
  uint32_t phase = 0;
  // The stage's empty barrier of every block of the cluster, one lane each (in a cluster of one,
  // lane 0's own).
  auto release = [&](int st) {
    __syncwarp();
    if (lane < static_cast<int>(cluster)) mbar_arrive_cluster(cluster_map(ring.bar_empty(st), lane));
  };
  // A split tile's piece, quantized P (sm90/forward_split.cuh): FQ_P's running max starts from
  // the max over every earlier key. A piece but the last first takes its own keys' maxima (S
  // alone per key tile, the producer loading K only) and publishes them; a piece after the first
  // then starts from the maxima of the pieces before it.
  const int split_barrier = 3 + c;  // a named barrier of this consumer's 128 threads (1, 2: turns)
  if constexpr (kQuantizeP) {
    if (work.pieces > 1) {
      const ForwardPartials<D, kQuantizeP, kConsumers> partials(P, work.split, c);
      if (keys_first) {
        float m_keys[2] = {-CUDART_INF_F, -CUDART_INF_F};
        for (int tile = sched.first(); tile >= 0; tile = sched.next(tile)) {
          mbar_wait(ring.bar_k(stage), phase);
          issue_s(k_desc(stage));
          wgmma_wait<0>();
          fence_registers(s_flat);
          // V's (empty) phase is complete before the stage is released: in a cluster the
          // partner's next V multicast may land on this barrier as soon as both blocks release.
          mbar_wait(ring.bar_v(stage), phase);
          release(stage);
          apply_mask(tile);
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int r = 0; r < 2; ++r)
              m_keys[r] = fmaxf(m_keys[r], fmaxf(s[j][2 * r], s[j][2 * r + 1]));
          if (++stage == kStages) stage = 0, phase ^= 1;
        }
#pragma unroll
        for (int r = 0; r < 2; ++r)  // the quad's row max, scaled as the softmax scales maxima
          m_keys[r] = __fmul_rn(quad_max(m_keys[r]), p.scale_log2);
        partials.publish_max(P, work.piece, tid, split_barrier, m_keys);
      }
      if (work.piece > 0) partials.earlier_max(P, work.piece, tid, split_barrier, m_run);
    }
  }

  // Ping-pong (FlashAttention-3's): the two consumers take turns to issue their products, each
  // turn {a tile's S, the previous tile's P·V}, so the tensor cores run one consumer's products
  // while the other works through its softmax (without it: -13% / -8%, session 19). Turn of
  // consumer c: named barrier 1 + c over both consumers' 256 threads; a consumer takes its turn
  // (sync) and passes it (arrive on the other's). Consumer 1 passes once first, so consumer 0 goes
  // first; both walk every tile of the schedule and take one more turn for the last P·V, and
  // consumer 0 syncs once more at the end, so that every arrival meets its sync. (Barrier 1 is
  // also warpgroup_sync's, which no consumer of this kernel calls: its tiles have no ragged rows
  // to zero.)
  static_assert(kConsumers == 2, "ping-pong between two consumers");
  auto take_turn = [&]() { named_barrier_sync(1 + c, 256); };
  auto pass_turn = [&]() { named_barrier_arrive(2 - c, 256); };
  named_barrier_arrive_if(c == 1, 1, 256);  // consumer 1 passes first
  {
    // Per tile: in this consumer's turn, the tile's S and then the previous tile's P·V (one issue
    // of its 2 x 4 products); S waited for alone, the tile's maxima, references and scales while
    // that P·V runs; then the wait for it (the operands overwrite the registers it reads, and a
    // rescale needs it complete), the rescale where a row's reference moved, and both sub-tiles'
    // exponentials and FQ_P as the next turn's operands. The first turn's P·V has P = 0, which
    // adds exactly nothing (its V is loaded and finite). (Session 19: +3.0% / +3.9% over issuing
    // the P·V before the S; session 17 had measured a P·V per sub-tile in this order within the
    // spread.) Two loops: the tiles this consumer computes ([first, compute_end): tiles ascend),
    // then the rest, whose stages it only waits for and releases (causal: the other consumer's
    // rows see them); a branch on the tile inside one loop made ptxas serialize the wgmma
    // pipeline (C7515).
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        a_hp[i][e] = 0u;
        if constexpr (kQuantizeP) a_q[i][e] = 0u;
      }
    int pending = -1, tile = sched.first();  // >= 0: Skv >= 1 (the API's shape checks)
    int last_stage = stage;
    mbar_wait(ring.bar_v(stage), phase);  // the first P = 0 reads this V (0 x garbage: NaN)
    for (; tile >= 0 && tile < compute_end; tile = sched.next(tile)) {
      const uint64_t k = k_desc(stage), v = v_desc(last_stage);  // outside the turn
      mbar_wait(ring.bar_k(stage), phase);
      take_turn();
      issue_s(k);
      issue_pv(v, 0, 2 * kSubTiles);
      pass_turn();
      wgmma_wait<1>();  // S; the P·V may still run
      fence_registers(s_flat);
      apply_mask(tile);
      float alpha[2];
      Softmax softmax;
      softmax.begin(s, m_run, m_ref, alpha, p.scale_log2);
      wgmma_wait<0>();
      fence_accumulators();
      keep_alive();
      if (pending >= 0) release(pending);
      if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) rescale(alpha);
      softmax.tile_operands(s, p.scale_log2, a_hp, a_q);
      mbar_wait(ring.bar_v(stage), phase);
      last_stage = pending = stage;
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    // (ptxas schedules this one's arithmetic after the barrier, in the same basic block: once per
    // block, not worth forcing.)
    const uint64_t v = v_desc(last_stage);
    take_turn();  // the last computed tile's P·V (P = 0 where this consumer computed none)
    issue_pv(v, 0, 2 * kSubTiles);
    pass_turn();
    wgmma_wait<0>();
    fence_accumulators();
    keep_alive();
    if (pending >= 0) release(pending);
    for (; tile >= 0; tile = sched.next(tile)) {
      mbar_wait(ring.bar_k(stage), phase);
      mbar_wait(ring.bar_v(stage), phase);
      take_turn();
      pass_turn();
      release(stage);
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    // (A predicated form, not the loop's: ptxas merged identical barrier code at the loop's exit
    // into the loop's last wgmma pipeline stage and serialized it, C7515.)
    named_barrier_sync_if(c == 0, 1, 256);  // consumer 0 meets consumer 1's last pass
  }
  // Every release is done: this block no longer touches its partner's shared memory.
  if (cluster > 1) cluster_arrive();

  // (b, h) from a fresh read of the block's index (opaque): the mainloop keeps no register for
  // them.
  const ForwardTile out(P, static_cast<int>(opaque(blockIdx.x)));
  if (out.pieces > 1) {  // a split tile: publish this piece's state, or merge the others'
    const ForwardPartials<D, kQuantizeP, kConsumers> partials(P, out.split, c);
    if (out.writes_partial()) {
      partials.publish(out.piece, tid, split_barrier, o, o_hp, m_ref);
      if (cluster > 1) cluster_wait();
      return;
    }
    for (int j = 0; j + 1 < out.pieces; ++j) partials.merge(j, tid, split_barrier, o, o_hp, m_ref);
  }
  // rows g and g + 8 (columns 2t, 2t + 1 of the ones block hold the same sum)
  const float l[2] = {o_hp[D / 2], o_hp[D / 2 + 2]};
  const float(&pv)[D / 2] = reinterpret_cast<const float(&)[D / 2]>(o_hp);  // P·V's D columns
  const int bh_out = out.tile / P.q_tiles;
  const int b_out = bh_out / p.Hq, h_out = bh_out % p.Hq;
  if constexpr (kQuantizeP) {
    store_forward_outputs<T, D, true>(p, b_out, h_out, row_base, t, o, pv, m_ref, l);
  } else {
    const float o_hp_unused[1] = {0.0f};
    store_forward_outputs<T, D, false>(p, b_out, h_out, row_base, t, pv, o_hp_unused, m_ref, l);
  }
  if (cluster > 1) cluster_wait();  // the partner's last arrivals on this block's barriers
}

}  // namespace fva::dev::sm90
