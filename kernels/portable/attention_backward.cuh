// The portable attention backward (mma.sync), shared by QAT attention and VSA. Two kernels after
// the Delta pre-pass, each over independent output tiles, so every gradient element is summed in
// one fixed order and the result is bitwise the same run to run (no atomics anywhere):
//   dQ:    a block owns 64 query rows and walks the key tiles of the forward's schedule,
//          recomputing P = 2^(s*scale*log2e - lse), dP = dO Vᵀ, dS = dtype(P (dP - Delta)),
//          dQ += dS K;
//   dK/dV: a block owns 64 keys (16 per warp, products transposed: rows are keys) and walks the
//          32-row query tiles that see them (the q heads of its GQA group in order), recomputing
//          Pᵀ and dSᵀ, with dV += dtype(FQ_P(P) or P)ᵀ dO and dK += dSᵀ Q.
// Recomputing P and dS in both kernels costs two extra products per tile pair; it buys the
// determinism without a dQ reduction buffer.
#pragma once

#include <math_constants.h>

#include "primitives/block_terms.cuh"
#include "primitives/sm80.cuh"
#include "shared/kernel_params.h"
#include "nvfp4/nvfp4_fragments.cuh"
#include "primitives/online_softmax.cuh"
#include "primitives/smem_tile.cuh"
#include "schedules/dkdv_grid.cuh"

namespace fva::dev {

constexpr int kBwdThreads = 128;

// ---- Delta = rowsum(o * dO), D / 8 lanes per row ----------------------------------------------

// A lane's 8 elements with one 16-byte load of each tensor where the tensors allow it (16-byte
// aligned bases, row strides in whole 8-element vectors: dense rows), else element by element.
// (Four memory passes of a warp per row, 2-byte loads of 64 bytes per warp instruction, would move
// o and dO at about half the DRAM's rate.)
//
// The grid strides over the rows, kDeltaUnroll row groups per warp at a time with all their loads
// issued before any product, so that a grid of a few blocks per SM (the VSA backward's, launched
// first and left resident beside the k2q inverse: src/cuda/vsa_ops.cpp) still keeps enough bytes in
// flight for the DRAM. A grid of one row group per warp (the QAT backward's) runs the loop once.
// With p.delta_done set, each block adds 1 to it once its rows are written and the kernels chained
// before it have completed (count_delta_block, after the kernel's wait: the release that the dK/dV
// block order's wait acquires, indices/vsa_invert.cu), so the full count also vouches for every
// kernel of the call before Delta.
constexpr int kDeltaUnroll = 4;

template <typename T, int D>
__device__ __forceinline__ void attention_delta(const kern::AttentionParams& p) {
  using E = typename T::Storage;
  constexpr int kLanesPerRow = D / 8, kRowsPerWarp = 32 / kLanesPerRow;
  const int64_t rows = static_cast<int64_t>(p.B) * p.Hq * p.Sq;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int64_t first_warp = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int col = (lane % kLanesPerRow) * 8;
  const kern::Tensor4 &ot = p.o_for_bwd, &dt = p.dout;
  const bool vectors =
      ((reinterpret_cast<uintptr_t>(ot.data) | reinterpret_cast<uintptr_t>(dt.data)) & 15) == 0 &&
      ((ot.stride_b | ot.stride_h | ot.stride_s | dt.stride_b | dt.stride_h | dt.stride_s) & 7) == 0;
  // Element offsets of row `row`'s lane slice in o and dO.
  auto offsets = [&](int64_t row, int64_t& oo, int64_t& od) {
    const int s = static_cast<int>(row % p.Sq);
    const int64_t bh = row / p.Sq;
    const int b = static_cast<int>(bh / p.Hq), h = static_cast<int>(bh % p.Hq);
    oo = b * ot.stride_b + h * ot.stride_h + s * ot.stride_s + col;
    od = b * dt.stride_b + h * dt.stride_h + s * dt.stride_s + col;
  };
  const E* o = static_cast<const E*>(ot.data);
  const E* d = static_cast<const E*>(dt.data);
  for (int64_t w0 = first_warp; w0 * kRowsPerWarp < rows; w0 += kDeltaUnroll * warps) {
    int64_t row[kDeltaUnroll];
    float sum[kDeltaUnroll];
#pragma unroll
    for (int u = 0; u < kDeltaUnroll; ++u) {
      row[u] = (w0 + u * warps) * kRowsPerWarp + lane / kLanesPerRow;
      sum[u] = 0.0f;
    }
    if (vectors) {
      uint4 ov[kDeltaUnroll], dv[kDeltaUnroll];
#pragma unroll
      for (int u = 0; u < kDeltaUnroll; ++u) {  // every load in flight before the products
        ov[u] = dv[u] = make_uint4(0, 0, 0, 0);
        if (row[u] < rows) {
          int64_t oo, od;
          offsets(row[u], oo, od);
          ov[u] = *reinterpret_cast<const uint4*>(o + oo);
          dv[u] = *reinterpret_cast<const uint4*>(d + od);
        }
      }
#pragma unroll
      for (int u = 0; u < kDeltaUnroll; ++u) {
        const uint32_t ow[4] = {ov[u].x, ov[u].y, ov[u].z, ov[u].w};
        const uint32_t dw[4] = {dv[u].x, dv[u].y, dv[u].z, dv[u].w};
        float of[8], df[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          of[2 * i] = T::low(ow[i]);
          of[2 * i + 1] = T::high(ow[i]);
          df[2 * i] = T::low(dw[i]);
          df[2 * i + 1] = T::high(dw[i]);
        }
        sum[u] = dot8(of, df);
      }
    } else {
#pragma unroll
      for (int u = 0; u < kDeltaUnroll; ++u) {
        if (row[u] >= rows) continue;
        int64_t oo, od;
        offsets(row[u], oo, od);
        for (int i = 0; i < 8; ++i) sum[u] = fmaf(T::to_float(o[oo + i]), T::to_float(d[od + i]), sum[u]);
      }
    }
    // Every lane takes part (rows past the end add zeros): the row's lanes are a power-of-two group.
#pragma unroll
    for (int u = 0; u < kDeltaUnroll; ++u) {
      sum[u] = lane_group_sum<kLanesPerRow>(sum[u]);
      if (row[u] < rows && lane % kLanesPerRow == 0) p.delta[row[u]] = sum[u];
    }
  }
}

// The block's addition to Delta's count (AttentionParams::delta_done), made once its rows are
// written and the kernel has waited for the kernels chained before it.
__device__ __forceinline__ void count_delta_block(const kern::AttentionParams& p) {
  if (p.delta_done == nullptr) return;
  __threadfence();  // this thread's rows, visible at gpu scope before the count
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(p.delta_done, 1);
}

// The host sizes Delta's grid by kern::delta_rows_per_warp.
static_assert(kern::delta_rows_per_warp(64) == 4 && kern::delta_rows_per_warp(128) == 2,
              "attention_delta's rows per warp: 32 / (D / 8)");

// ---- the two products both kernels start a tile with -----------------------------------------------

// x = A0 B0ᵀ and y = A1 B1ᵀ for the warp's 16 rows of the A tiles (from a_row) against the first
// 16 NP columns of the B tiles, reduced over D: dQ's S = Q Kᵀ and dP = dO Vᵀ (rows: queries), and
// dK/dV's Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (rows: keys). Both pairs share their A row and B column, so
// one ldmatrix of each serves two mma.
template <typename T, int D, int NP, typename ATile, typename BTile>
__device__ __forceinline__ void two_products(float (&x)[2 * NP][4], float (&y)[2 * NP][4],
                                             const ATile& a0, const ATile& a1, const BTile& b0,
                                             const BTile& b1, int a_row, int lane) {
#pragma unroll
  for (int j = 0; j < 2 * NP; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[j][e] = y[j][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t ax[4], ay[4];
    ldmatrix_x4(ax, a0.a_operand(a_row, kk * 16, lane));
    ldmatrix_x4(ay, a1.a_operand(a_row, kk * 16, lane));
#pragma unroll
    for (int np = 0; np < NP; ++np) {
      uint32_t bx[4], by[4];
      ldmatrix_x4(bx, b0.b_operand(np * 16, kk * 16, lane));
      ldmatrix_x4(by, b1.b_operand(np * 16, kk * 16, lane));
      mma_16816<T>(x[2 * np], ax, bx[0], bx[1]);
      mma_16816<T>(x[2 * np + 1], ax, bx[2], bx[3]);
      mma_16816<T>(y[2 * np], ay, by[0], by[1]);
      mma_16816<T>(y[2 * np + 1], ay, by[2], by[3]);
    }
  }
}

// ---- dQ -----------------------------------------------------------------------------------------

template <typename T, int D, typename Schedule>
__device__ __forceinline__ void attention_backward_dq(const kern::AttentionParams& p, char* smem) {
  const RecordCheck check = RecordCheck::load(p);  // the VSA layer's record, decided at the stores
  using Tile = SmemTile<64, D>;
  using E = typename T::Storage;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int bh = blockIdx.y;
  const int b = bh / p.Hq, h = bh % p.Hq;
  const int hk = h / (p.Hq / p.Hkv);
  const int q0 = (gridDim.x - 1 - blockIdx.x) * 64;

  const Tile sq{smem_address(smem)};
  const Tile sdo{sq.base + Tile::kBytes};
  const Tile sk[2] = {Tile{sq.base + 2 * Tile::kBytes}, Tile{sq.base + 3 * Tile::kBytes}};
  const Tile sv[2] = {Tile{sq.base + 4 * Tile::kBytes}, Tile{sq.base + 5 * Tile::kBytes}};

  const E* qg = static_cast<const E*>(p.q.data) + b * p.q.stride_b + h * p.q.stride_h;
  const E* dog = static_cast<const E*>(p.dout.data) + b * p.dout.stride_b + h * p.dout.stride_h;
  const E* kg = static_cast<const E*>(p.k.data) + b * p.k.stride_b + hk * p.k.stride_h;
  const E* vg = static_cast<const E*>(p.v.data) + b * p.v.stride_b + hk * p.v.stride_h;

  Schedule sched(p, b, h, q0);
  int tile = sched.first();
  sq.template load_async<kBwdThreads>(qg + q0 * p.q.stride_s, p.q.stride_s, p.Sq - q0, p.q.data);
  sdo.template load_async<kBwdThreads>(dog + q0 * p.dout.stride_s, p.dout.stride_s, p.Sq - q0,
                                       p.dout.data);
  if (tile >= 0) {
    const int k0 = sched.key0(tile), n = sched.valid_keys(tile);
    sk[0].template load_async<kBwdThreads>(kg + k0 * p.k.stride_s, p.k.stride_s, n, p.k.data);
    sv[0].template load_async<kBwdThreads>(vg + k0 * p.v.stride_s, p.v.stride_s, n, p.v.data);
  }
  cp_async_commit();

  const int row_base = q0 + warp * 16 + g;
  float lse[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_base + 8 * r;
    const bool ok = row < p.Sq;
    lse[r] = ok ? p.lse.data[b * p.lse.stride_b + h * p.lse.stride_h + row * p.lse.stride_s] : 0.0f;
    delta[r] = ok ? p.delta[(static_cast<int64_t>(bh)) * p.Sq + row] : 0.0f;
  }

  float dq[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[j][e] = 0.0f;
  float ds_sum[2] = {0.0f, 0.0f};

  for (int it = 0; tile >= 0; ++it) {
    const int buf = it & 1;
    const int next = sched.next(tile);
    cp_async_wait<0>();
    __syncthreads();
    if (next >= 0) {
      const int k0 = sched.key0(next), n = sched.valid_keys(next);
      sk[buf ^ 1].template load_async<kBwdThreads>(kg + k0 * p.k.stride_s, p.k.stride_s, n, p.k.data);
      sv[buf ^ 1].template load_async<kBwdThreads>(vg + k0 * p.v.stride_s, p.v.stride_s, n, p.v.data);
    }
    cp_async_commit();

    float s[8][4], dp[8][4];
    two_products<T, D, 4>(s, dp, sq, sdo, sk[buf], sv[buf], warp * 16, lane);

    const int k0 = sched.key0(tile), n_valid = sched.valid_keys(tile);
    // dS in the accumulator layout, then as A operands (k = keys) of dQ += dS K.
    uint32_t a_ds[4][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int slot = j * 8 + 2 * t + (e & 1);
        const int r = e >> 1;
        const bool vis = sched.visible(row_base + 8 * r, k0 + slot, slot, n_valid) &&
                         lse[r] != -CUDART_INF_F;
        const float pv = fast_exp2(fmaf(s[j][e], p.scale_log2, -lse[r]));
        ds[e] = vis ? T::round(pv * (dp[j][e] - delta[r])) : 0.0f;
        ds_sum[r] += ds[e];
      }
      pack_a_tile<T>(a_ds, j, ds);
    }
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
#pragma unroll
      for (int dpair = 0; dpair < D / 16; ++dpair) {
        uint32_t bk[4];
        ldmatrix_x4_trans(bk, sk[buf].b_operand_trans(kb * 16, dpair * 16, lane));
        mma_16816<T>(dq[2 * dpair], a_ds[kb], bk[0], bk[1]);
        mma_16816<T>(dq[2 * dpair + 1], a_ds[kb], bk[2], bk[3]);
      }
    }
    tile = next;
  }

  // dQ = scale * (dS K + rowsum(dS) * mean(k)) (the mean term only with smooth_k).
  float rowsum[2] = {quad_sum(ds_sum[0]), quad_sum(ds_sum[1])};
  cp_async_wait<0>();
  __syncthreads();
  // The VSA layer's block terms of the thread's two rows (p.terms), if any.
  const RowTerms<T, D> terms[2] = {
      RowTerms<T, D>(p.terms.dq, static_cast<int64_t>(b) * p.Hq + h, p.vsa.num_q_blocks,
                     static_cast<int64_t>(q0) + warp * 16 + g, t),
      RowTerms<T, D>(p.terms.dq, static_cast<int64_t>(b) * p.Hq + h, p.vsa.num_q_blocks,
                     static_cast<int64_t>(q0) + warp * 16 + g + 8, t)};
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    const int col = j * 8 + 2 * t;
    float mean0 = 0.0f, mean1 = 0.0f;
    if (p.k_mean != nullptr) {
      mean0 = p.k_mean[col];
      mean1 = p.k_mean[col + 1];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float x0 = dq[j][2 * r], x1 = dq[j][2 * r + 1];
      if (p.k_mean != nullptr) {
        x0 += rowsum[r] * mean0;
        x1 += rowsum[r] * mean1;
      }
      sq.store_pair(warp * 16 + g + 8 * r, col, terms[r].pack(p.scale * x0, p.scale * x1, j));
    }
  }
  __syncthreads();
  if (!check.passes(p)) return;  // the VSA layer's record disagrees: write nothing
  E* dqg = static_cast<E*>(p.dq.data) + b * p.dq.stride_b + h * p.dq.stride_h + q0 * p.dq.stride_s;
  sq.template store_rows<kBwdThreads>(dqg, p.dq.stride_s, p.Sq - q0);
}

// ---- dK / dV --------------------------------------------------------------------------------------

// Max over the two warps of a pair, per accumulator column: `mine` holds the thread's 8 columns
// (n8 tile j, column 2t + c at index 2j + c), already reduced over the warp's 16 rows.
__device__ __forceinline__ void pair_max_columns(float (&mine)[8], float* slots, int& use) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = lane & 3;
  float* half = slots + (use & 1) * 4 * 32;
  if ((lane >> 2) == 0) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) half[warp * 32 + j * 8 + 2 * t + c] = mine[2 * j + c];
  }
  named_barrier_sync(1 + warp / 2, 64);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c)
      mine[2 * j + c] = fmaxf(mine[2 * j + c], half[(warp ^ 1) * 32 + j * 8 + 2 * t + c]);
  ++use;
}

// kBlockP: dV's FQ_P uses block scales (known at compile time: no second-level code); otherwise
// p.p_scale decides at run time.
template <typename T, int D, typename Schedule, bool kBlockP = false>
__device__ __forceinline__ void attention_backward_dkdv(const kern::AttentionParams& p, char* smem) {
  const RecordCheck check = RecordCheck::load(p);  // the VSA layer's record, decided at the stores
  using KTile = SmemTile<64, D>;
  using QTile = SmemTile<32, D>;
  using E = typename T::Storage;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  // (b, kv head) and the first key (VSA: longest lists first; schedules/dkdv_grid.cuh).
  const DkdvBlock blk = dkdv_block<Schedule>(p, 0);
  const int b = blk.unit / p.Hkv, hk = blk.unit % p.Hkv;
  const int k0 = blk.key_block * 64;

  const KTile sk{smem_address(smem)};
  const KTile sv{sk.base + KTile::kBytes};
  const QTile sq[2] = {QTile{sk.base + 2 * KTile::kBytes},
                       QTile{sk.base + 2 * KTile::kBytes + QTile::kBytes}};
  const QTile sdo[2] = {QTile{sk.base + 2 * KTile::kBytes + 2 * QTile::kBytes},
                        QTile{sk.base + 2 * KTile::kBytes + 3 * QTile::kBytes}};
  float* s_lse = reinterpret_cast<float*>(smem + 2 * KTile::kBytes + 4 * QTile::kBytes);  // [2][32]
  float* s_delta = s_lse + 64;                                                             // [2][32]
  float* slots = s_delta + 64;                                                             // [2][4][32]
  int slot_use = 0;

  const E* kg = static_cast<const E*>(p.k.data) + b * p.k.stride_b + hk * p.k.stride_h;
  const E* vg = static_cast<const E*>(p.v.data) + b * p.v.stride_b + hk * p.v.stride_h;
  Schedule sched(p, b, hk, k0);
  const int n_keys = sched.valid_keys();
  sk.template load_async<kBwdThreads>(kg + k0 * p.k.stride_s, p.k.stride_s, n_keys, p.k.data);
  sv.template load_async<kBwdThreads>(vg + k0 * p.v.stride_s, p.v.stride_s, n_keys, p.v.data);

  // Loads query tile `it` of the schedule (its q head and first row) into buffer `buf`.
  auto load_q_tile = [&](const typename Schedule::Cursor& c, int buf) {
    const int h = c.head, r0 = c.row0;
    const E* qg = static_cast<const E*>(p.q.data) + b * p.q.stride_b + h * p.q.stride_h;
    const E* dog = static_cast<const E*>(p.dout.data) + b * p.dout.stride_b + h * p.dout.stride_h;
    sq[buf].template load_async<kBwdThreads>(qg + r0 * p.q.stride_s, p.q.stride_s, p.Sq - r0, p.q.data);
    sdo[buf].template load_async<kBwdThreads>(dog + r0 * p.dout.stride_s, p.dout.stride_s, p.Sq - r0,
                                              p.dout.data);
    if (threadIdx.x < 32) {
      const int row = r0 + threadIdx.x;
      const bool ok = row < p.Sq;
      s_lse[buf * 32 + threadIdx.x] =
          ok ? p.lse.data[b * p.lse.stride_b + h * p.lse.stride_h + row * p.lse.stride_s] : 0.0f;
      s_delta[buf * 32 + threadIdx.x] =
          ok ? p.delta[(static_cast<int64_t>(b) * p.Hq + h) * p.Sq + row] : 0.0f;
    }
  };

  typename Schedule::Cursor cur = sched.first();
  if (cur.valid()) load_q_tile(cur, 0);
  cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.0f;

  const int slot_base = warp * 16 + g;

  for (int it = 0; cur.valid(); ++it) {
    const int buf = it & 1;
    typename Schedule::Cursor nxt = sched.next(cur);
    cp_async_wait<0>();
    __syncthreads();
    if (nxt.valid()) load_q_tile(nxt, buf ^ 1);
    cp_async_commit();

    // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: this warp's 16 keys x the tile's 32 queries.
    float st[4][4], dpt[4][4];
    two_products<T, D, 2>(st, dpt, sk, sv, sq[buf], sdo[buf], warp * 16, lane);

    // Pᵀ (masked entries 0) and dSᵀ = dtype(Pᵀ (dPᵀ - Delta)).
    const float* lse_t = s_lse + buf * 32;
    const float* delta_t = s_delta + buf * 32;
    float pt[4][4];
    uint32_t a_ds[2][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = j * 8 + 2 * t + (e & 1);
        const int key_slot = slot_base + 8 * (e >> 1);
        const float l = lse_t[col];
        const bool vis = cur.row0 + col < p.Sq && l != -CUDART_INF_F &&
                         sched.visible(cur.row0 + col, k0 + key_slot, key_slot, n_keys);
        pt[j][e] = vis ? fast_exp2(fmaf(st[j][e], p.scale_log2, -l)) : 0.0f;
        ds[e] = vis ? T::round(pt[j][e] * (dpt[j][e] - delta_t[col])) : 0.0f;
      }
      pack_a_tile<T>(a_ds, j, ds);
    }

    // What dV multiplies: FQ_P(P) (groups of 16 keys = this warp's rows, one per query column)
    // or P itself.
    if (Schedule::kMayQuantizeP && p.quantize_p) {
      float second_amax[8];  // per column (row mode) or all equal (tile mode)
      if (kBlockP) {
        // block scales: no second level
      } else if (p.p_scale == 2) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int c = 0; c < 2; ++c)
            second_amax[2 * j + c] = column_max(fmaxf(pt[j][c], pt[j][2 + c]));
        pair_max_columns(second_amax, slots, slot_use);
      } else if (p.p_scale == 1) {
        float m = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) m = nvfp4_amax_step(m, pt[j][e]);
        m = pair_max(warp_max(m), slots, slot_use);
#pragma unroll
        for (int i = 0; i < 8; ++i) second_amax[i] = m;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float x[2] = {pt[j][c], pt[j][2 + c]};
          const float amax = column_max(fmaxf(nvfp4_amax_step(0.0f, x[0]), nvfp4_amax_step(0.0f, x[1])));
          const SecondLevel second = kBlockP || p.p_scale == 0
                                         ? SecondLevel{}
                                         : nvfp4_second_level(second_amax[2 * j + c]);
          fake_quantize_values(x, amax, second);
          pt[j][c] = x[0];
          pt[j][2 + c] = x[1];
        }
    }
    uint32_t a_p[2][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) pack_a_tile<T>(a_p, j, pt[j]);

    // dV += Pᵀ dO and dK += dSᵀ Q (k = the tile's 32 queries).
#pragma unroll
    for (int kb = 0; kb < 2; ++kb) {
#pragma unroll
      for (int dpair = 0; dpair < D / 16; ++dpair) {
        uint32_t bd[4], bq[4];
        ldmatrix_x4_trans(bd, sdo[buf].b_operand_trans(kb * 16, dpair * 16, lane));
        ldmatrix_x4_trans(bq, sq[buf].b_operand_trans(kb * 16, dpair * 16, lane));
        mma_16816<T>(dv[2 * dpair], a_p[kb], bd[0], bd[1]);
        mma_16816<T>(dv[2 * dpair + 1], a_p[kb], bd[2], bd[3]);
        mma_16816<T>(dk[2 * dpair], a_ds[kb], bq[0], bq[1]);
        mma_16816<T>(dk[2 * dpair + 1], a_ds[kb], bq[2], bq[3]);
      }
    }
    cur = nxt;
  }

  cp_async_wait<0>();
  __syncthreads();  // K and V are no longer read: their tiles take dK and dV
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + g + 8 * r;
    const int64_t unit = static_cast<int64_t>(b) * p.Hkv + hk, key = static_cast<int64_t>(k0) + row;
    // The VSA layer's block terms of the row (p.terms), if any.
    const RowTerms<T, D> kterm(p.terms.dk, unit, p.vsa.num_kv_blocks, key, t);
    const RowTerms<T, D> vterm(p.terms.dv, unit, p.vsa.num_kv_blocks, key, t);
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int col = j * 8 + 2 * t;
      sk.store_pair(row, col, kterm.pack(p.scale * dk[j][2 * r], p.scale * dk[j][2 * r + 1], j));
      sv.store_pair(row, col, vterm.pack(dv[j][2 * r], dv[j][2 * r + 1], j));
    }
  }
  __syncthreads();
  if (!check.passes(p)) return;  // the VSA layer's record disagrees: write nothing
  const int rows = sched.output_rows();
  E* dkg = static_cast<E*>(p.dk.data) + b * p.dk.stride_b + hk * p.dk.stride_h + k0 * p.dk.stride_s;
  E* dvg = static_cast<E*>(p.dv.data) + b * p.dv.stride_b + hk * p.dv.stride_h + k0 * p.dv.stride_s;
  sk.template store_rows<kBwdThreads>(dkg, p.dk.stride_s, rows);
  sv.template store_rows<kBwdThreads>(dvg, p.dv.stride_s, rows);
}

}  // namespace fva::dev
