// The QAT forward's consumer mainloop: a consumer warpgroup owns 64 query rows and, per key tile
// the producer streams through the ring (sm90/forward_ring.cuh),
//     S = Q Kᵀ (wgmma, both operands in shared memory) -> mask -> online softmax -> P·V (wgmma,
//     P from registers, V in shared memory): both P·V products, FQ_P(P) and P.
// A key tile is S, then the tile's maxima (the running max advances per 32-key sub-tile, as in the
// CPU reference) and NVFP4 scales while the previous tile's P·V runs, then both sub-tiles'
// exponentials and FQ_P, whose P·V is issued in one go right after the next tile's S. With
// quantized P, K and V tiles are in the owned-group key order (shared/key_order.h): each lane's 16
// columns of a row are one NVFP4 group, so the groups' maxima and scales need no exchange. The
// accumulators are relative to a lazy reference max (primitives/online_softmax.cuh's tile
// softmaxes): a rescale is rare, once per tile before its operands, and each warp's own choice.
// The two consumers ping-pong (FlashAttention-3's schedule, named barriers): each in turn issues
// {its next tile's S, its previous tile's P·V}, so the tensor cores run one consumer's products
// while the other works through its softmax. The softmax's NVFP4 arithmetic, latency-bound with
// two consumer warps per scheduler, and the turns between the consumers, not the tensor pipe,
// bound the kernel.
#pragma once

#include <math_constants.h>

#include <type_traits>

#include "shared/kernel_params.h"
#include "shared/key_order.h"
#include "primitives/online_softmax.cuh"
#include "sm90/forward_epilogue.cuh"
#include "sm90/forward_ring.cuh"
#include "sm90/forward_split.cuh"

namespace fva::dev::sm90 {

// A consumer thread's output accumulators, declared by the kernel: o_hp, P·[V | ones], the
// dtype-rounded P's product (the output itself without quantization), with the rows' sums l in its
// last n8 block (registers D / 2 .. D / 2 + 3: every column holds its row's sum; l sums bf16(p),
// the operand P·V reads, as SPEC defines l). The sums ride on P·V's own wgmma (N = D + 8 against
// V's stage and the region of ones after it) and are rescaled with o. o: FQ_P(P)·V (kQuantizeP).
template <int D, bool kQuantizeP>
__device__ __forceinline__ void zero_accumulators(float (&o)[kQuantizeP ? D / 2 : 1],
                                                  float (&o_hp)[D / 2 + 4]) {
#pragma unroll
  for (int i = 0; i < D / 2 + 4; ++i) o_hp[i] = 0.0f;
  if constexpr (kQuantizeP) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  }
}
template <int D, bool kQuantizeP>
__device__ __forceinline__ void fence_accumulators(float (&o)[kQuantizeP ? D / 2 : 1],
                                                   float (&o_hp)[D / 2 + 4]) {
  if constexpr (kQuantizeP) fence_registers(o);
  fence_registers(o_hp);
}
// Every element *= alpha of its row. The accumulators must be complete (waited for).
template <int D, bool kQuantizeP>
__device__ __forceinline__ void rescale_accumulators(float (&o)[kQuantizeP ? D / 2 : 1],
                                                     float (&o_hp)[D / 2 + 4],
                                                     const float (&alpha)[2]) {
  fence_accumulators<D, kQuantizeP>(o, o_hp);
#pragma unroll
  for (int i = 0; i < D / 2 + 4; ++i) o_hp[i] *= alpha[(i >> 1) & 1];  // l too (D / 2 % 4 == 0)
  if constexpr (kQuantizeP) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
  }
}

// P (and FQ_P(P)) of a key tile's 4 k16 steps as the A operands of P·V, declared by the kernel.
// The tensor cores read them after the issuing instruction, so each is kept alive until the wait
// that covers its P·V: otherwise the compiler could reuse the registers.
template <bool kQuantizeP>
__device__ __forceinline__ void zero_pv_operands(uint32_t (&a_hp)[4][4],
                                                 uint32_t (&a_q)[kQuantizeP ? 4 : 1][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      a_hp[i][e] = 0u;
      if constexpr (kQuantizeP) a_q[i][e] = 0u;
    }
}
template <bool kQuantizeP>
__device__ __forceinline__ void keep_pv_operands_alive(uint32_t (&a_hp)[4][4],
                                                       uint32_t (&a_q)[kQuantizeP ? 4 : 1][4]) {
  keep_operands_alive(a_hp);
  if constexpr (kQuantizeP) keep_operands_alive(a_q);
}

// S = Q Kᵀ: D / 16 k16 steps, 32 bytes apart within a 128-byte row, 4 steps per region.
template <typename T, int D>
__device__ __forceinline__ void issue_scores(float (&s)[32], uint64_t q_desc, uint64_t k_desc) {
  wgmma_fence();
  wgmma_tiles_abt_desc<T, D>(s, q_desc, k_desc);
  wgmma_commit();
}

// [o_hp | l] += P·[V | ones] (and o += FQ_P(P)·V) over the tile's 4 k16 steps (16 keys, 2048
// bytes of V each), from V's descriptor.
template <typename T, int D, bool kQuantizeP>
__device__ __forceinline__ void issue_pv(float (&o)[kQuantizeP ? D / 2 : 1],
                                         float (&o_hp)[D / 2 + 4], uint32_t (&a_hp)[4][4],
                                         uint32_t (&a_q)[kQuantizeP ? 4 : 1][4], uint64_t v_base) {
  wgmma_fence();
#pragma unroll
  for (int step = 0; step < 4; ++step) {
    const uint64_t v_desc = smem_descriptor_advance(v_base, step * 2048);
    if constexpr (kQuantizeP) wgmma_rs_mn<T, D>(o, a_q[step], v_desc);
    wgmma_rs_mn<T, D + 8>(o_hp, a_hp[step], v_desc);  // V's D columns, then 8 of ones
  }
  wgmma_commit();
}

// One consumer warpgroup of the QAT forward: where its thread works (make), the pieces of its
// mainloop, and run: the mainloop over the block's key tiles, then the epilogue
// (sm90/forward_epilogue.cuh).
template <typename T, int D, typename Schedule, bool kQuantizeP, int kConsumers, int kStages>
struct ForwardConsumer {
  using Ring = ForwardRing<D, kConsumers, kStages>;
  static_assert(Schedule::kSubTile == 32, "the tile softmaxes: 32-key softmax sub-tiles");
  static_assert(kConsumers == 2, "ping-pong between two consumers");
  // Quantized P: K and V tiles in the owned-group key order (shared/key_order.h), each lane's
  // NVFP4 groups its own.
  using Softmax = std::conditional_t<kQuantizeP, OwnedGroupTileSoftmax<T>,
                                     LazyTileSoftmax<T, 64 / Schedule::kSubTile>>;

  const Ring& ring;
  const Schedule& sched;
  const kern::AttentionParams& p;
  int c;  // the consumer: warpgroup - 1
  int tid, lane, t;  // the thread in the warpgroup, its lane, and lane % 4
  int row_base;  // this thread's rows: row_base, row_base + 8
  uint32_t q_tile;
  // Tiles below unmasked_end need no mask; from compute_end on, no row of this consumer sees a key
  // (causal; or every row is past Sq).
  int unmasked_end, compute_end;
  uint32_t cluster;  // the blocks of the block's cluster (1 or 2)

  // Consumer warpgroup `warpgroup` (1 or 2) of a block whose first query row is q0.
  static __device__ __forceinline__ ForwardConsumer make(const Ring& ring, const Schedule& sched,
                                                         const kern::AttentionParams& p,
                                                         int warpgroup, int q0, uint32_t cluster) {
    const int c = __shfl_sync(0xffffffffu, warpgroup, 0) - 1;  // warp-uniform, as ptxas sees it
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = q0 + 64 * c;                  // this consumer's first row
    const int last_row = min(p.Sq, row0 + 64) - 1;  // < row0: every row is past Sq
    const int row_base = row0 + 16 * warp + g;      // this thread's rows: row_base, row_base + 8
    const uint32_t q_tile = ring.query_tile(c);
    const int unmasked_end = sched.unmasked_end(row0);
    const int compute_end = last_row >= row0 ? sched.visible_end(last_row) : 0;
    return {ring, sched, p, c, tid, lane, t, row_base, q_tile, unmasked_end, compute_end, cluster};
  }

  // The products' shared-memory descriptors, built outside the turn: a stage's address goes
  // through a shuffle (warp-uniform as the compiler sees it: the descriptors live in uniform
  // registers), and each descriptor through opaque64 where it is built, so that the compiler cannot
  // rebuild it later, after the turn's barrier, as a chain of dependent uniform instructions before
  // the first wgmma while the other consumer waits for the turn.
  __device__ __forceinline__ uint64_t k_desc(int st) const {
    return opaque64(kmajor_tile_descriptor(ring.k_tile(__shfl_sync(0xffffffffu, st, 0))));
  }
  __device__ __forceinline__ uint64_t v_desc(int st) const {
    return opaque64(mnmajor_tile_descriptor(ring.v_tile(__shfl_sync(0xffffffffu, st, 0))));
  }

  // The stage's empty barrier of every block of the cluster, one lane each (in a cluster of one,
  // lane 0's own).
  __device__ __forceinline__ void release(int st) const {
    __syncwarp();
    if (lane < static_cast<int>(cluster))
      mbar_arrive_cluster(cluster_map(ring.bar_empty(st), lane));
  }

  // Ping-pong turns: consumer c's turn is named barrier 1 + c over both consumers' 256 threads; a
  // consumer takes its turn (sync) and passes it (arrive on the other's).
  __device__ __forceinline__ void take_turn() const { named_barrier_sync(1 + c, 256); }
  __device__ __forceinline__ void pass_turn() const { named_barrier_arrive(2 - c, 256); }

  // Masked logits of a key tile from unmasked_end on (the whole 64 x 64 tile is visible below).
  __device__ __forceinline__ void apply_mask(float (&s)[8][4], int tile) const {
    if (tile < unmasked_end) return;
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
  }

  // The consumer's mainloop over the block's key tiles, then its epilogue.
  // Per tile: in this consumer's turn, the tile's S and then the previous tile's P·V (one issue of
  // its 2 x 4 products); S waited for alone, the tile's maxima, references and scales while that
  // P·V runs; then the wait for it (the operands overwrite the registers it reads, and a rescale
  // needs it complete), the rescale where a row's reference moved, and both sub-tiles'
  // exponentials and FQ_P as the next turn's operands. The first turn's P·V has P = 0, which adds
  // exactly nothing (its V is loaded and finite). Two loops: the tiles this consumer computes
  // ([first, compute_end): tiles ascend), then the rest, whose stages it only waits for and
  // releases (causal: the other consumer's rows see them); a branch on the tile inside one loop
  // makes ptxas serialize the wgmma pipeline (C7515).
  // Consumer 1 passes its turn once first, so consumer 0 goes first; both walk every tile of the
  // schedule and take one more turn for the last P·V, and consumer 0 syncs once more at the end,
  // so that every arrival meets its sync. (Barrier 1 is also warpgroup_sync's, which no consumer of
  // this kernel calls: its tiles have no ragged rows to zero.)
  __device__ __forceinline__ void run(const kern::Sm90ForwardParams& P, const ForwardTile& work,
                                      bool keys_first) const {
    // The accumulators o (FQ_P(P)·V, quantized P) and o_hp (P·[V | ones]: P·V and the rows' sums
    // l); the running max (FQ_P's, SPEC.md) and the reference o, o_hp and l are kept relative to
    // (LazyTileSoftmax and OwnedGroupTileSoftmax, primitives/online_softmax.cuh); S of one key
    // tile, and P (and FQ_P(P)) of its 4 k16 steps as the A operands of P·V.
    float o[kQuantizeP ? D / 2 : 1], o_hp[D / 2 + 4];
    zero_accumulators<D, kQuantizeP>(o, o_hp);
    float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F}, m_ref[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float s[8][4];
    float(&s_flat)[32] = reinterpret_cast<float(&)[32]>(s);
    uint32_t a_hp[4][4], a_q[kQuantizeP ? 4 : 1][4];
    const uint64_t q_desc = opaque64(kmajor_tile_descriptor(q_tile));
    mbar_wait(ring.bar_query(), 0);
    int stage = 0;
    uint32_t phase = 0;
    // A split tile's piece with quantized P (sm90/forward_split.cuh): FQ_P's running max starts
    // from the max over every earlier key. A piece but the last first takes its own keys' maxima
    // (S alone per key tile, the producer loading K only) and publishes them; a piece after the
    // first then starts from the maxima of the pieces before it.
    const int split_barrier = 3 + c;  // a named barrier of this consumer's 128 threads
    if constexpr (kQuantizeP) {
      if (work.pieces > 1) {
        const ForwardPartials<D, kQuantizeP, kConsumers> partials(P, work.split, c);
        if (keys_first) {
          float m_keys[2] = {-CUDART_INF_F, -CUDART_INF_F};
          for (int tile = sched.first(); tile >= 0; tile = sched.next(tile)) {
            mbar_wait(ring.bar_k(stage), phase);
            issue_scores<T, D>(s_flat, q_desc, k_desc(stage));
            wgmma_wait<0>();
            fence_registers(s_flat);
            // V's (empty) phase is complete before the stage is released: in a cluster the
            // partner's next V multicast may land on this barrier as soon as both blocks release.
            mbar_wait(ring.bar_v(stage), phase);
            release(stage);
            apply_mask(s, tile);
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

    named_barrier_arrive_if(c == 1, 1, 256);  // consumer 1 passes first
    zero_pv_operands<kQuantizeP>(a_hp, a_q);
    int pending = -1, tile = sched.first();  // >= 0: Skv >= 1 (the API's shape checks)
    int last_stage = stage;
    mbar_wait(ring.bar_v(stage), phase);  // the first P = 0 reads this V (0 x garbage: NaN)
    for (; tile >= 0 && tile < compute_end; tile = sched.next(tile)) {
      const uint64_t k = k_desc(stage), v = v_desc(last_stage);  // outside the turn
      mbar_wait(ring.bar_k(stage), phase);
      take_turn();
      issue_scores<T, D>(s_flat, q_desc, k);
      issue_pv<T, D, kQuantizeP>(o, o_hp, a_hp, a_q, v);
      pass_turn();
      wgmma_wait<1>();  // S; the P·V may still run
      fence_registers(s_flat);
      apply_mask(s, tile);
      float alpha[2];
      Softmax softmax;
      softmax.begin(s, m_run, m_ref, alpha, p.scale_log2);
      wgmma_wait<0>();
      fence_accumulators<D, kQuantizeP>(o, o_hp);
      keep_pv_operands_alive<kQuantizeP>(a_hp, a_q);
      if (pending >= 0) release(pending);
      if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f))
        rescale_accumulators<D, kQuantizeP>(o, o_hp, alpha);
      softmax.tile_operands(s, p.scale_log2, a_hp, a_q);
      mbar_wait(ring.bar_v(stage), phase);
      last_stage = pending = stage;
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    // (ptxas schedules this one's arithmetic after the barrier, in the same basic block: once per
    // block, not worth forcing.)
    const uint64_t v = v_desc(last_stage);
    take_turn();  // the last computed tile's P·V (P = 0 where this consumer computed none)
    issue_pv<T, D, kQuantizeP>(o, o_hp, a_hp, a_q, v);
    pass_turn();
    wgmma_wait<0>();
    fence_accumulators<D, kQuantizeP>(o, o_hp);
    keep_pv_operands_alive<kQuantizeP>(a_hp, a_q);
    if (pending >= 0) release(pending);
    for (; tile >= 0; tile = sched.next(tile)) {
      mbar_wait(ring.bar_k(stage), phase);
      mbar_wait(ring.bar_v(stage), phase);
      take_turn();
      pass_turn();
      release(stage);
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    // (A predicated form, not the loop's: ptxas merges identical barrier code at the loop's exit
    // into the loop's last wgmma pipeline stage and serializes it, C7515.)
    named_barrier_sync_if(c == 0, 1, 256);  // consumer 0 meets consumer 1's last pass
    // Every release is done: this block no longer touches its partner's shared memory.
    if (cluster > 1) cluster_arrive();

    // Where the rows go, from a fresh read of the block's index (opaque): the mainloop then keeps
    // no register for (b, h).
    const ForwardTile out(P, static_cast<int>(opaque(blockIdx.x)));
    if (publish_or_merge_pieces<D, kQuantizeP, kConsumers>(P, out, o, o_hp, m_ref, c, tid,
                                                           split_barrier, cluster))
      return;
    const float l[2] = {o_hp[D / 2], o_hp[D / 2 + 2]};  // rows g and g + 8 (each column: the sum)
    store_forward_tile<T, D, kQuantizeP>(P, out, o, o_hp, m_ref, l, row_base, t);
    if (cluster > 1) cluster_wait();  // the partner's last arrivals on this block's barriers
  }
};

}  // namespace fva::dev::sm90
