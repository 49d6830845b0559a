// A compact sm_90a forward for VSA: one warpgroup per block and no producer warpgroup, several
// blocks per SM (ThunderKittens' VSA forward is built this way). The warp-specialized forward
// (attention_forward_sm90.cuh) gives each 64-row q block a producer and a consumer warpgroup, two
// blocks per SM, so an SM runs two consumers; here each block is only its consumer, and kBlocks of
// them share an SM, whose warp schedulers interleave one block's softmax with the others' products.
// The loads need no pipeline of their own: thread 0 issues the TMA for the next tile's K as soon as
// this tile's S has read K, and the next V once P·V has read V, so a load runs under the softmax or
// the next S.
//
// Shared memory (1024-byte aligned regions): Q | K | V | mbarriers (Q, K, V), a tile = 64 rows x D.
// EXPERIMENTAL (branch wip/vsa-compact-fwd): not run on a GPU yet.
#pragma once

#include <math_constants.h>

#include "common/kernel_params.h"
#include "common/online_softmax.cuh"
#include "hopper/attention_forward_sm90.cuh"  // store_forward_outputs
#include "hopper/query_stream_sm90.cuh"

namespace fva::dev::sm90 {

template <int D>
struct CompactLayout {
  static constexpr int kRegionBytes = 64 * 128;
  static constexpr int kRegions = D / 64;
  static constexpr int kTileBytes = kRegions * kRegionBytes;
  static constexpr int kQ = 0, kK = kTileBytes, kV = 2 * kTileBytes, kBarriers = 3 * kTileBytes;
  static_assert(kern::sm90_compact_forward_smem_bytes(D) == kBarriers + 3 * 8,
                "host and device disagree on the shared-memory layout");
};

template <typename T, int D, typename Schedule>
__device__ __forceinline__ void attention_forward_compact_sm90(const kern::Sm90ForwardParams& P,
                                                               char* smem) {
  using L = CompactLayout<D>;
  static_assert(Schedule::kSubTile == 64, "one softmax step per 64-key tile (VSA)");
  constexpr int kNT = 8;
  const kern::AttentionParams& p = P.a;

  const uint32_t base = smem_addr(smem);
  if (base & 1023) __trap();  // the 128-byte swizzle needs 1024-byte aligned regions
  const uint32_t q_tile = base + L::kQ, k_tile = base + L::kK, v_tile = base + L::kV;
  const uint32_t bar_q = base + L::kBarriers, bar_k = bar_q + 8, bar_v = bar_q + 16;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int bh = blockIdx.y;
  const int b = bh / p.Hq, h = bh % p.Hq;
  const int hk = h / (p.Hq / p.Hkv);
  const int row0 = (gridDim.x - 1 - blockIdx.x) * 64;
  const int row_base = row0 + 16 * warp + g;
  const Schedule sched(p, b, h, row0);

  auto load = [&](uint32_t dst, const kern::TensorMap* map, uint32_t bar, int row, int head) {
    mbar_arrive_expect_tx(bar, L::kTileBytes);
    for (int r = 0; r < L::kRegions; ++r)
      tma_load_4d(dst + r * L::kRegionBytes, map, bar, 64 * r, row, head, b);
  };
  const int first = sched.first();
  if (tid == 0) {
    mbar_init(bar_q, 1);
    mbar_init(bar_k, 1);
    mbar_init(bar_v, 1);
    mbar_fence_init();
    tma_prefetch_descriptor(&P.q);
    tma_prefetch_descriptor(&P.k);
    tma_prefetch_descriptor(&P.v);
    load(q_tile, &P.q, bar_q, row0, h);
    if (first >= 0) {
      load(k_tile, &P.k, bar_k, sched.key0(first), hk);
      load(v_tile, &P.v, bar_v, sched.key0(first), hk);
    }
  }
  __syncthreads();

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  fence_registers(o);  // distinct registers (see attention_dq_sm90.cuh)
  float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.0f, 0.0f};
  float s[8][4];
  float(&s_flat)[32] = reinterpret_cast<float(&)[32]>(s);
  uint32_t a_hp[4][4], a_none[1][4];
  auto keep_alive = [&]() {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a_hp[i][e]));
  };
  // The warpgroup's products that read a tile are complete in every warp before thread 0 lets the
  // TMA overwrite it.
  auto warpgroup_sync = []() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); };

  mbar_wait(bar_q, 0);
  uint32_t phase = 0;
  for (int tile = first; tile >= 0;) {
    const int next = sched.next(tile);
    mbar_wait(bar_k, phase);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t offset = (kk / 4) * L::kRegionBytes + (kk % 4) * 32;
      wgmma_ss_chain<T, 64>(s_flat, smem_descriptor(q_tile + offset, 16, 1024),
                            smem_descriptor(k_tile + offset, 16, 1024), kk);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(s_flat);
    warpgroup_sync();
    if (tid == 0 && next >= 0) load(k_tile, &P.k, bar_k, sched.key0(next), hk);

    // Mask (ragged blocks), softmax, P as the A operands of P·V.
    const int n_valid = sched.valid_keys(tile);
    if (n_valid < 64) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (j * 8 + 2 * t + (e & 1) >= n_valid) s[j][e] = Schedule::kMaskedLogit;
    }
    float alpha[2];
    online_softmax_step<T, kNT, false>(s, m, l, alpha, p.scale_log2, a_hp, a_none,
                                       BlockScalesOnly{});
    // Skipped when no row of the warpgroup raised its max (alpha exactly 1); the vote is the
    // warpgroup's so that every warp reaches the P·V below at the same instruction.
    if (warpgroup_any(alpha[0] != 1.0f || alpha[1] != 1.0f, 2)) {
      fence_registers(o);
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
    mbar_wait(bar_v, phase);
    if (n_valid < 64) zero_tile_rows<L::kRegions>(v_tile, n_valid, tid);  // 0 * NaN is not 0
    wgmma_fence();
#pragma unroll
    for (int step = 0; step < 4; ++step)
      wgmma_rs_mn<T, D>(o, a_hp[step],
                        smem_descriptor(v_tile + step * 2048, L::kRegionBytes, 1024));
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(o);
    keep_alive();
    warpgroup_sync();
    if (tid == 0 && next >= 0) load(v_tile, &P.v, bar_v, sched.key0(next), hk);
    phase ^= 1;
    tile = next;
  }

  const float o_hp_unused[1] = {0.0f};
  store_forward_outputs<T, D, false>(p, b, h, row_base, t, o, o_hp_unused, m, l);
}

}  // namespace fva::dev::sm90
