// The sm_90a forwards' epilogues: o = acc / l (and o_hp), lse = m + log2(l) per row, from the
// accumulators of a consumer warpgroup (the wgmma layout: a thread's rows row_base and
// row_base + 8, columns 8j + 2t + {0, 1}).
//   - The QAT forward (sm90/attention_forward.cuh): a split tile's pieces first publish or merge
//     their states (sm90/forward_split.cuh), then each thread stores its rows' column pairs.
//   - The VSA forward (sm90/attention_forward_compact.cuh): o goes through shared memory and one
//     TMA store of the tile, as FlashAttention-3 stores it.
// The division is acc * (1 / l), one reciprocal per row as FlashAttention's epilogues do: within
// two ulps of the element-wise division in fp32, before the dtype's rounding (SPEC's tolerances
// hold), where the division costs about 10 instructions per element (reciprocal, five FMAs, a
// range check and its branch).
#pragma once

#include <math_constants.h>

#include "shared/kernel_params.h"
#include "primitives/sm90.cuh"
#include "sm90/compact_tiles.cuh"
#include "sm90/forward_split.cuh"

namespace fva::dev::sm90 {

// The row's log-sum-exp (base 2, of the scaled logits), -inf for a row that saw no key, NaN for a
// row whose sum is NaN (a NaN or Inf among its inputs: SPEC-notes' NaN rule).
__device__ __forceinline__ void store_row_lse(const kern::AttentionParams& p, int b, int h, int row,
                                              float m, float l) {
  p.lse.data[b * p.lse.stride_b + h * p.lse.stride_h + row * p.lse.stride_s] =
      l != 0.0f ? m + log2f(l) : -CUDART_INF_F;
}

// The outputs of a thread's two rows (row_base, row_base + 8): o = acc / l (and o_hp), lse; a row
// without a visible key (VSA: l = 0) gets o = 0 and lse = -inf, a row whose l is NaN gets NaN.
// Rows past Sq are not written.
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
    const bool any = l[r] != 0.0f;  // a NaN l (a NaN or Inf input) gives NaN, not an empty row
    const float inv = any ? __frcp_rn(l[r]) : 0.0f;  // o = 0 where l = 0 (acc is 0 there)
    // The row's column pairs, one 4-byte store each, 16 bytes apart per n8 block: one address per
    // row, the rest immediate offsets.
    uint32_t* o_row = reinterpret_cast<uint32_t*>(og + row * p.o.stride_s + 2 * t);
    uint32_t* hp_row =
        hg != nullptr ? reinterpret_cast<uint32_t*>(hg + row * p.o_hp.stride_s + 2 * t) : nullptr;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const float a = o[4 * j + 2 * r] * inv;
      const float bb = o[4 * j + 2 * r + 1] * inv;
      o_row[4 * j] = T::pack(a, bb);
      if (hp_row != nullptr) {
        float ha = a, hb = bb;
        if constexpr (kQuantizeP) {
          ha = o_hp[4 * j + 2 * r] * inv;
          hb = o_hp[4 * j + 2 * r + 1] * inv;
        }
        hp_row[4 * j] = T::pack(ha, hb);
      }
    }
    if (t == 0) store_row_lse(p, b, h, row, m[r], l[r]);
  }
}

// A split tile's piece (sm90/forward_split.cuh) after its mainloop, for one consumer warpgroup (c;
// tid its thread; split_barrier a named barrier of its 128 threads) whose rows' state is o
// (FQ_P(P)·V, quantized P) and o_hp (P·[V | ones], the rows' sums in its last n8 block), both
// relative to m_ref: a piece but the last publishes its state and returns true (it stores no
// outputs; with clusters, it has waited for its partner's last arrivals on its barriers); the
// last merges the others' states into its own and returns false, as does an unsplit tile.
template <int D, bool kQuantizeP, int kConsumers>
__device__ __forceinline__ bool publish_or_merge_pieces(const kern::Sm90ForwardParams& P,
                                                        const ForwardTile& out,
                                                        float (&o)[kQuantizeP ? D / 2 : 1],
                                                        float (&o_hp)[D / 2 + 4],
                                                        float (&m_ref)[2], int c, int tid,
                                                        int split_barrier, uint32_t cluster) {
  if (out.pieces > 1) {
    const ForwardPartials<D, kQuantizeP, kConsumers> partials(P, out.split, c);
    if (out.writes_partial()) {
      partials.publish(out.piece, tid, split_barrier, o, o_hp, m_ref);
      if (cluster > 1) cluster_wait();
      return true;
    }
    for (int j = 0; j + 1 < out.pieces; ++j) partials.merge(j, tid, split_barrier, o, o_hp, m_ref);
  }
  return false;
}

// The QAT forward's outputs of a consumer thread's rows in query tile `out`: o_hp's first D columns
// hold P·V (the output without quantization), l the rows' sums (o_hp's last n8 block).
template <typename T, int D, bool kQuantizeP>
__device__ __forceinline__ void store_forward_tile(const kern::Sm90ForwardParams& P,
                                                   const ForwardTile& out,
                                                   const float (&o)[kQuantizeP ? D / 2 : 1],
                                                   const float (&o_hp)[D / 2 + 4],
                                                   const float (&m_ref)[2], const float (&l)[2],
                                                   int row_base, int t) {
  const kern::AttentionParams& p = P.a;
  const float(&pv)[D / 2] = reinterpret_cast<const float(&)[D / 2]>(o_hp);  // P·V's D columns
  const int bh_out = out.tile / P.q_tiles;
  const int b_out = bh_out / p.Hq, h_out = bh_out % p.Hq;
  if constexpr (kQuantizeP) {
    store_forward_outputs<T, D, true>(p, b_out, h_out, row_base, t, o, pv, m_ref, l);
  } else {
    const float o_hp_unused[1] = {0.0f};
    store_forward_outputs<T, D, false>(p, b_out, h_out, row_base, t, pv, o_hp_unused, m_ref, l);
  }
}

// What a caller adds to the VSA forward's epilogue: nothing (the VSA layer's call adds its output
// pass, sm90/fused_layer_gate.cuh's LayerOutputStage). stage() sees every packed o word the
// epilogue stages, at its byte offset in the tile; store() runs on the thread that issues the tile's
// TMA store, before the commit.
struct NoExtraOutput {
  __device__ __forceinline__ void stage(uint32_t, int, uint32_t) const {}
  __device__ __forceinline__ void store(int, int, int) const {}
};

// The VSA forward's epilogue (a 64-row q block, one warpgroup: tid, warp, g, t): o = [o | l]'s D
// columns / l through shared memory and the TMA, lse by the threads. Each thread writes its
// normalized, packed pairs into `staging` (a free tile of Tiles, the Q tile once the last S has
// read it) in the map's 128-byte swizzle, one conflict-free 4-byte store each (a warp's 32 lanes
// hit 32 banks), and one thread stores the tile: the TMA writes whole lines and skips rows past
// Sq. Where the rows go comes from fresh reads of the block's index (opaque): the mainloop then
// keeps no register for them. `extra` sees each staged word and issues its own stores with o's.
template <typename T, int D, typename Tiles, typename Extra = NoExtraOutput>
__device__ __forceinline__ void store_forward_outputs_tma(const kern::Sm90ForwardParams& P,
                                                          const float (&o)[D / 2 + 4],
                                                          const float (&m)[2], uint32_t staging,
                                                          int tid, int warp, int g, int t,
                                                          const Extra& extra = Extra{}) {
  const kern::AttentionParams& p = P.a;
  const float l[2] = {o[D / 2], o[D / 2 + 2]};  // rows g and g + 8 (every column holds the sum)
  const CompactBlock out(p, opaque(blockIdx.x), opaque(blockIdx.y));
  const int row_base = out.row0 + 16 * warp + g;  // this thread's rows: row_base, row_base + 8
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float inv = l[r] != 0.0f ? __frcp_rn(l[r]) : 0.0f;  // o = 0 where l = 0 (acc is 0); NaN l: NaN
    const int row = 16 * warp + g + 8 * r;  // row % 8 = g
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const uint32_t offset = swizzled_chunk_128b((j / 8) * Tiles::kRegionBytes, row, g, j % 8) + 4 * t;
      const uint32_t word = T::pack(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
      st_shared_u32(staging + offset, word);
      extra.stage(offset, j, word);
    }
  }
  fence_proxy_async();
  warpgroup_sync();
  if (tid == 0) {
#pragma unroll
    for (int r = 0; r < Tiles::kRegions; ++r)
      tma_store_4d(&P.o, staging + r * Tiles::kRegionBytes, 64 * r, out.row0, out.h, out.b);
    extra.store(out.row0, out.h, out.b);
    bulk_store_commit();
  }
#pragma unroll
  for (int r = 0; r < 2; ++r)
    if (t == 0 && row_base + 8 * r < p.Sq)
      store_row_lse(p, out.b, out.h, row_base + 8 * r, m[r], l[r]);
  if (tid == 0) bulk_store_wait_read();  // the tiles stay allocated until the TMA has read them
}

}  // namespace fva::dev::sm90
