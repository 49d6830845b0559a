// The fp32 dQ accumulator of the fused backward (sm_90a, handles that are not deterministic): the
// dK/dV kernel (sm90/attention_dkdv.cuh with kFuseDq) adds each (key tile, query tile) pair's
// dS K into it with fp32 reductions in L2, instead of a dQ kernel recomputing S and dP per pair
// (2 of the backward's 7 products). The reductions' order varies run to run, so dQ is not bitwise
// reproducible; deterministic handles keep the dQ kernel (sm90/attention_dq.cuh).
//
// Layout (the host zeroes it before the dK/dV kernel): per (b, q head) and 64-row query tile,
// 64 x D floats in the wgmma accumulator's fragment order. Thread (warp w, lane) of an m64nD
// fragment holds, for each 8-column group j, rows 16w + lane / 4 + {0, 8} x columns 8j +
// 2 (lane % 4) + {0, 1} in its registers d[4j .. 4j + 3]; those 4 floats sit together at float
// offset ((w D/8 + j) 32 + lane) 4, so a warp's 16-byte reductions of one j cover 512 contiguous
// bytes (four whole 128-byte lines). (The fused kernel's consumer c holds the m64n64 half of
// groups j = 8c ... 8c + 7.) Beside it, rowsum(dS) per row ([b, q head, tile, 64]) for QAT's
// smooth-K term.
#pragma once

#include "shared/kernel_params.h"
#include "primitives/sm90.cuh"

namespace fva::dev::sm90 {

// The accumulator tile of (b Hq + h, 64-row query tile `tile`).
template <int D>
__device__ __forceinline__ float* dq_accumulator_tile(const kern::Sm90BackwardParams& P, int bh,
                                                      int tile) {
  return P.dq_accum + (static_cast<int64_t>(bh) * P.q_tiles + tile) * (64 * D);
}

__device__ __forceinline__ float* ds_rowsum_tile(const kern::Sm90BackwardParams& P, int bh,
                                                 int tile) {
  return P.ds_rowsum + (static_cast<int64_t>(bh) * P.q_tiles + tile) * 64;
}

// acc (a warpgroup's m64n64 fp32 fragments: columns 64 part ... 64 part + 63 of D) added into the
// accumulator tile.
template <int D>
__device__ __forceinline__ void reduce_dq_fragments(float* tile, const float (&acc)[32], int part,
                                                    int warp, int lane) {
  float* at = tile + ((warp * (D / 8) + 8 * part) * 32 + lane) * 4;
#pragma unroll
  for (int j = 0; j < 8; ++j)
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(at + j * 32 * 4),
                 "f"(acc[4 * j]), "f"(acc[4 * j + 1]), "f"(acc[4 * j + 2]), "f"(acc[4 * j + 3])
                 : "memory");
}

// sums (an m64n8 fragment whose every column is a row's sum) added into the rowsum tile: the lanes
// holding column 0 add their two rows.
__device__ __forceinline__ void reduce_row_sums(float* tile, const float (&sums)[4], int warp,
                                                int lane) {
  if ((lane & 3) != 0) return;
  const int row = warp * 16 + lane / 4;
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(tile + row), "f"(sums[0]) : "memory");
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(tile + row + 8), "f"(sums[2]) : "memory");
}

// dQ = dtype(scale (acc + rowsum(dS) mean(k))) for rows below Sq (mean(k): QAT smooth_k, else no
// term). A 128-thread block per (64-row query tile, b Hq + h), thread for thread the layout above.
template <typename T, int D>
__device__ __forceinline__ void convert_dq_accumulator_sm90(const kern::Sm90BackwardParams& P,
                                                            char* /*smem*/) {
  using E = typename T::Storage;
  const kern::AttentionParams& p = P.a;
  const int tile = blockIdx.x, bh = blockIdx.y, b = bh / p.Hq, h = bh % p.Hq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane & 3;
  const int row_base = tile * 64 + warp * 16 + lane / 4;
  const float* acc = dq_accumulator_tile<D>(P, bh, tile) + (warp * (D / 8) * 32 + lane) * 4;
  float rowsum[2] = {0.0f, 0.0f};
  if (p.k_mean != nullptr) {
    const float* rs = ds_rowsum_tile(P, bh, tile);
    rowsum[0] = rs[row_base - tile * 64];
    rowsum[1] = rs[row_base - tile * 64 + 8];
  }
  E* dqg = static_cast<E*>(p.dq.data) + b * p.dq.stride_b + h * p.dq.stride_h;
#pragma unroll 4
  for (int j = 0; j < D / 8; ++j) {
    const float4 x = *reinterpret_cast<const float4*>(acc + j * 32 * 4);
    const int col = j * 8 + 2 * t;
    float2 mean = make_float2(0.0f, 0.0f);
    if (p.k_mean != nullptr) mean = *reinterpret_cast<const float2*>(p.k_mean + col);
    if (row_base < p.Sq)
      *reinterpret_cast<uint32_t*>(dqg + static_cast<int64_t>(row_base) * p.dq.stride_s + col) =
          T::pack(p.scale * (x.x + rowsum[0] * mean.x), p.scale * (x.y + rowsum[0] * mean.y));
    if (row_base + 8 < p.Sq)
      *reinterpret_cast<uint32_t*>(dqg + static_cast<int64_t>(row_base + 8) * p.dq.stride_s +
                                   col) =
          T::pack(p.scale * (x.z + rowsum[1] * mean.x), p.scale * (x.w + rowsum[1] * mean.y));
  }
}

}  // namespace fva::dev::sm90
