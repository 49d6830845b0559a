// The Hopper-native dQ kernel (sm_90a) of the VSA backward: the VSA forward's shape
// (attention_forward_compact_sm90.cuh) applied to dQ. One warpgroup per 64-row q block, no producer
// warpgroup, three blocks per SM (168 registers per thread; Q, dO, K and V tiles: 64 KiB at D=128).
// A block walks its q block's q2k list, as the forward does:
//     S = Q Kᵀ, dP = dO Vᵀ                      (wgmma, shared-memory operands, one commit group)
//     dS = dtype(P (dP - Delta)), P = 2^(S scale log2e - lse)      (ds_tile, attention_dq_sm90.cuh)
//     dQ += dS K                                (wgmma, dS from registers, K read MN-major)
// Thread 0 loads the next listed block's V once dP has read V (under the dS arithmetic and the dQ
// product), and its K once the dQ product has read K. The rows are the block's own and the list's
// order is fixed, so dQ is a fixed-order sum, as in the warp-specialized kernel.
// Why not QAT's warp-specialized dQ (attention_dq_sm90.cuh): there a VSA q block got a producer
// and a consumer warpgroup, two blocks per SM (a q block's list is its own, so consumers share no
// tiles); here three consumers share an SM, whose warp schedulers run one block's dS arithmetic
// under the others' products. Measured at S=16384 on the H200: 0.82 -> 0.79 ms (docs/perf.md).
#pragma once

#include <math_constants.h>

#include "common/kernel_params.h"
#include "common/online_softmax.cuh"
#include "hopper/attention_dq_sm90.cuh"  // load_dq_row_stats, ds_tile, store_dq
#include "hopper/compact_tiles_sm90.cuh"
#include "hopper/query_stream_sm90.cuh"  // zero_tile_rows

namespace fva::dev::sm90 {

template <typename T, int D, typename Schedule>
__device__ __forceinline__ void attention_dq_compact_sm90(const kern::Sm90BackwardParams& P,
                                                          char* smem) {
  using L = CompactTiles<D, 4>;
  constexpr int kQ = 0, kDO = 1, kK = 2, kV = 3;  // tiles
  const kern::AttentionParams& p = P.a;

  // The dK/dV kernel that follows needs nothing dQ writes: it may fill this grid's last wave.
  allow_dependent_launch();
  const L tiles{smem_addr(smem)};
  if (tiles.base & 1023) __trap();  // the 128-byte swizzle needs 1024-byte aligned regions
  const uint32_t q_tile = tiles.tile(kQ), do_tile = tiles.tile(kDO);
  const uint32_t k_tile = tiles.tile(kK), v_tile = tiles.tile(kV);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  if (tid == 0) {
    tiles.init_barriers();
    tma_prefetch_descriptor(&P.q);
    tma_prefetch_descriptor(&P.dout);
    tma_prefetch_descriptor(&P.k);
    tma_prefetch_descriptor(&P.v);
  }
  __syncthreads();

  const int bh = blockIdx.y;
  const int b = bh / p.Hq, h = bh % p.Hq;
  const int hk = h / (p.Hq / p.Hkv);
  const int row0 = (gridDim.x - 1 - blockIdx.x) * 64;
  const int row_base = row0 + 16 * warp + g;  // this thread's rows: row_base, row_base + 8
  const Schedule sched(p, b, h, row0);
  const int first = sched.first();
  if (tid == 0) {
    tiles.load(kQ, &P.q, tiles.bar_query(), row0, h, b, 2);  // Q and dO on one barrier
    tiles.load(kDO, &P.dout, tiles.bar_query(), row0, h, b, 0);
    if (first >= 0) {
      tiles.load(kK, &P.k, tiles.bar_k(), sched.key0(first), hk, b);
      tiles.load(kV, &P.v, tiles.bar_v(), sched.key0(first), hk, b);
    }
  }

  float lse[2], delta[2];
  load_dq_row_stats(p, b, h, bh, row_base, lse, delta);
  float dq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dq[i] = 0.0f;
  fence_registers(dq);  // distinct registers (see attention_dq_sm90.cuh)
  float ds_sum[2] = {0.0f, 0.0f};
  float s[8][4], dp[8][4];
  float(&s_flat)[32] = reinterpret_cast<float(&)[32]>(s);
  float(&dp_flat)[32] = reinterpret_cast<float(&)[32]>(dp);
  uint32_t a_ds[4][4];  // dS as the A operands of the tile's 4 k16 steps (keys)
  auto keep_alive = [&]() {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a_ds[i][e]));
  };

  mbar_wait(tiles.bar_query(), 0);
  uint32_t phase = 0;  // of the K and V barriers, which complete once per listed block
  for (int tile = first; tile >= 0;) {
    const int next = sched.next(tile);
    mbar_wait(tiles.bar_k(), phase);
    mbar_wait(tiles.bar_v(), phase);
    wgmma_fence();
    wgmma_tiles_abt<T, D>(s_flat, q_tile, k_tile);
    wgmma_tiles_abt<T, D>(dp_flat, do_tile, v_tile);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(s_flat);
    fence_registers(dp_flat);
    warpgroup_sync();
    if (tid == 0 && next >= 0) tiles.load(kV, &P.v, tiles.bar_v(), sched.key0(next), hk, b);

    ds_tile<T>(sched, tile, row0, row_base, t, p.scale_log2, s, dp, lse, delta, ds_sum, a_ds);
    if constexpr (Schedule::kPaddedBlocks) {
      // dS is 0 at a ragged block's padding slots, but 0 * NaN is not: those rows of K become
      // zeros before dS K reads them (S, which also read them, is complete in every warp). (QAT's
      // keys past Skv are outside the tensor: the TMA filled them with zeros.)
      const int n_valid = sched.valid_keys(tile);
      if (n_valid < 64) zero_tile_rows<L::kRegions>(k_tile, n_valid, tid);
    }
    // dQ += dS K: k16 steps over the tile's keys (16 rows, 2048 bytes each) of the MN-major K.
    wgmma_fence();
#pragma unroll
    for (int step = 0; step < 4; ++step)
      wgmma_rs_mn<T, D>(dq, a_ds[step], smem_descriptor(k_tile + step * 2048, L::kRegionBytes, 1024));
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(dq);
    keep_alive();
    warpgroup_sync();
    if (tid == 0 && next >= 0) tiles.load(kK, &P.k, tiles.bar_k(), sched.key0(next), hk, b);
    phase ^= 1;
    tile = next;
  }

  store_dq<T, D>(p, b, h, row_base, t, dq, ds_sum);
}

}  // namespace fva::dev::sm90
