// The Hopper-native dQ kernel (sm_90a) of the QAT attention backward, and the dQ helpers it shares
// with VSA's compact dQ kernel (attention_dq_compact_sm90.cuh). It walks the forward's schedule (key
// tiles from 0) with the forward's producer and ring (query_stream_sm90.cuh; the query tiles are Q
// and dO), and each consumer warpgroup owns 64 query rows:
//     S = Q Kᵀ, dP = dO Vᵀ                      (wgmma, shared-memory operands, one commit group)
//     P = 2^(S scale log2e - lse) (masked: 0), dS = dtype(P (dP - Delta))
//     dQ += dS K                                (wgmma, dS from registers, K read MN-major)
// and finally stores dQ = scale (dQ + rowsum(dS) mean(k)) (the mean term: QAT smooth_k). A block's
// rows are its own and the tiles come in a fixed order, so dQ is a fixed-order sum: bitwise
// reproducible on every handle, with no reduction buffer. The dQ product of one tile stays in
// flight while the next tile's S and dP are issued; its stage is released after the wait that
// covers it. P's quantization plays no part in dQ (SPEC.md: dS uses the high-precision P), so
// every P scale mode runs here.
#pragma once

#include <math_constants.h>

#include "common/kernel_params.h"
#include "common/online_softmax.cuh"
#include "hopper/query_stream_sm90.cuh"

namespace fva::dev::sm90 {

// lse and Delta of a thread's two rows (row_base, row_base + 8); a row past Sq contributes nothing
// (lse -inf selects its dS away, as for a row without a visible key).
// bh = b Hq + h.
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
__device__ __forceinline__ void ds_tile(const Schedule& sched, int tile, int row0, int row_base,
                                        int t, float scale_log2, const float (&s)[8][4],
                                        const float (&dp)[8][4], const float (&lse)[2],
                                        const float (&delta)[2], float (&ds_sum)[2],
                                        uint32_t (&a_ds)[4][4]) {
  const int k0 = sched.key0(tile), n_valid = sched.valid_keys(tile);
  const bool unmasked = sched.unmasked(tile, row0);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float ds[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int slot = j * 8 + 2 * t + (e & 1), r = e >> 1;
      const bool vis = (lse[r] != -CUDART_INF_F) &
                       (unmasked | sched.visible(row_base + 8 * r, k0 + slot, slot, n_valid));
      const float pv = fast_exp2(__fmul_rn(s[j][e], scale_log2) - lse[r]);
      ds[e] = vis ? T::round(pv * (dp[j][e] - delta[r])) : 0.0f;
      ds_sum[r] += ds[e];
    }
    a_ds[j / 2][(j & 1) * 2 + 0] = T::pack(ds[0], ds[1]);
    a_ds[j / 2][(j & 1) * 2 + 1] = T::pack(ds[2], ds[3]);
  }
}

// dQ = scale (dS K + rowsum(dS) mean(k)) of a thread's two rows; rows past Sq are not written.
template <typename T, int D>
__device__ __forceinline__ void store_dq(const kern::AttentionParams& p, int b, int h, int row_base,
                                         int t, const float (&dq)[D / 2],
                                         const float (&ds_sum)[2]) {
  using E = typename T::Storage;
  const float rowsum[2] = {quad_sum(ds_sum[0]), quad_sum(ds_sum[1])};
  E* dqg = static_cast<E*>(p.dq.data) + b * p.dq.stride_b + h * p.dq.stride_h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_base + 8 * r;
    if (row >= p.Sq) continue;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int col = j * 8 + 2 * t;
      float x0 = dq[4 * j + 2 * r], x1 = dq[4 * j + 2 * r + 1];
      if (p.k_mean != nullptr) {
        x0 += rowsum[r] * p.k_mean[col];
        x1 += rowsum[r] * p.k_mean[col + 1];
      }
      *reinterpret_cast<uint32_t*>(dqg + row * p.dq.stride_s + col) =
          T::pack(p.scale * x0, p.scale * x1);
    }
  }
}

template <typename T, int D, typename Schedule, int kConsumers, int kStages>
__device__ __forceinline__ void attention_dq_sm90(const kern::Sm90BackwardParams& P, char* smem) {
  using L = QueryStreamLayout<D, 2 * kConsumers, kStages>;  // query tiles: Q[c], then dO[c]
  static_assert(!Schedule::kPaddedBlocks,
                "ragged (VSA) blocks need their K padding zeroed: attention_dq_compact_sm90.cuh");
  const kern::AttentionParams& p = P.a;

  // The dK/dV kernel that follows needs nothing dQ writes: it may fill this grid's last wave.
  allow_dependent_launch();
  const L ring{smem_addr(smem)};
  if (ring.base & 1023) __trap();  // the 128-byte swizzle needs 1024-byte aligned regions

  const int warpgroup = threadIdx.x / 128;  // 0: producer; 1..kConsumers: consumers
  const int bh = blockIdx.y;
  const int b = bh / p.Hq, h = bh % p.Hq;
  const int hk = h / (p.Hq / p.Hkv);
  const int q0 = (gridDim.x - 1 - blockIdx.x) * 64 * kConsumers;  // heaviest (causal) first
  const Schedule sched(p, b, h, q0 + 64 * (kConsumers - 1));

  if (threadIdx.x == 0) ring.init_barriers(kConsumers * 4);
  __syncthreads();

  if (warpgroup == 0) {
    // ---- producer ------------------------------------------------------------------------------
    setmaxnreg_dec<RegisterSplit<kConsumers>::kProducer>();
    if (threadIdx.x == 0) {
      const kern::TensorMap* const query[2] = {&P.q, &P.dout};
      ring.template produce<kConsumers>(query, &P.k, &P.v, sched, q0, h, hk, b);
    }
    return;
  }

  // ---- consumers --------------------------------------------------------------------------------
  setmaxnreg_inc<RegisterSplit<kConsumers>::kConsumer>();
  const int c = warpgroup - 1;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = q0 + 64 * c;
  const int row_base = row0 + 16 * warp + g;      // this thread's rows: row_base, row_base + 8
  const uint32_t q_tile = ring.query_tile(c), do_tile = ring.query_tile(kConsumers + c);

  float lse[2], delta[2];
  load_dq_row_stats(p, b, h, bh, row_base, lse, delta);

  float dq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dq[i] = 0.0f;
  // Distinct registers from here: otherwise the compiler lets the zeros share one register and
  // copies them apart inside the wgmma pipeline, which serializes it (ptxas C7515).
  fence_registers(dq);
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
  auto release = [&](int st) {
    __syncwarp();
    if (lane == 0) mbar_arrive(ring.bar_empty(st));
  };

  mbar_wait(ring.bar_query(), 0);
  int stage = 0, pending = -1;
  uint32_t phase = 0;
  for (int tile = sched.first(); tile >= 0; tile = sched.next(tile)) {
    // Every consumer runs every tile of the block's schedule: with causal QAT, a tile the first
    // consumer's rows do not see is fully masked (dS = 0, a no-op on dQ) and costs one tile of
    // work, but the loop has no branch around the products. (A branch made the dQ accumulators
    // path-dependent, and ptxas serialized the wgmmas, C7515.)
    mbar_wait(ring.bar_k(stage), phase);
    mbar_wait(ring.bar_v(stage), phase);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t offset = (kk / 4) * L::kRegionBytes + (kk % 4) * 32;
      wgmma_ss_chain<T, 64>(s_flat, smem_descriptor(q_tile + offset, 16, 1024),
                            smem_descriptor(ring.k_tile(stage) + offset, 16, 1024), kk);
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t offset = (kk / 4) * L::kRegionBytes + (kk % 4) * 32;
      wgmma_ss_chain<T, 64>(dp_flat, smem_descriptor(do_tile + offset, 16, 1024),
                            smem_descriptor(ring.v_tile(stage) + offset, 16, 1024), kk);
    }
    wgmma_commit();
    wgmma_wait<1>();  // the previous tile's dQ product (committed before this tile's S and dP)
    fence_registers(dq);
    keep_alive();
    if (pending >= 0) release(pending);
    pending = stage;
    wgmma_wait<0>();
    fence_registers(s_flat);
    fence_registers(dp_flat);
    ds_tile<T>(sched, tile, row0, row_base, t, p.scale_log2, s, dp, lse, delta, ds_sum, a_ds);
    // dQ += dS K: k16 steps over the tile's keys (16 rows, 2048 bytes each) of the MN-major K.
    wgmma_fence();
#pragma unroll
    for (int step = 0; step < 4; ++step)
      wgmma_rs_mn<T, D>(dq, a_ds[step],
                        smem_descriptor(ring.k_tile(stage) + step * 2048, L::kRegionBytes, 1024));
    wgmma_commit();
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
  wgmma_wait<0>();
  fence_registers(dq);
  keep_alive();

  store_dq<T, D>(p, b, h, row_base, t, dq, ds_sum);
}

}  // namespace fva::dev::sm90
