// The portable attention forward (FlashAttention-2 structure on mma.sync), shared by QAT attention
// and VSA. A block owns 64 query rows and walks the key tiles its schedule lists, 64 keys each:
//     S = Q Kᵀ -> mask -> online softmax (base 2) -> [NVFP4 fake quantization of P] -> O += P V.
// Two shapes of block (Layout below):
//   - 4 warps x 16 rows, K and V double-buffered through cp.async (QAT: its two accumulators and
//     the quantization leave no registers for more rows per warp);
//   - 2 warps x 32 rows, K and V single-buffered in FlashAttention-2's order (V's load overlaps
//     S and the softmax, the next K's load overlaps P·V): each K/V fragment read from shared memory
//     feeds two MMAs, and the smaller block (48 KiB at D = 128) lets four blocks share an SM (VSA,
//     whose 64-row q blocks each have their own kv list, so a block cannot grow past 64 rows).
// Schedules (schedules/qat.cuh, schedules/vsa.cuh) say which key tiles a
// query tile visits, which keys of a tile are visible, and what a masked logit becomes.
//
// The softmax runs over sub-tiles of Schedule::kSubTile keys (QAT: 32, VSA: 64) because QAT
// quantizes P relative to the running max, so the running max must advance exactly as in the CPU
// reference's 32-key tiles for the quantized P (and the result) to agree.
#pragma once

#include <math_constants.h>

#include "primitives/sm80.cuh"
#include "shared/kernel_params.h"
#include "nvfp4/nvfp4_fragments.cuh"
#include "primitives/online_softmax.cuh"
#include "primitives/smem_tile.cuh"

namespace fva::dev {

constexpr int kFwdRows = 64;  // query rows per block
constexpr int kKeyTile = 64;  // keys per loaded tile

// Writes o = acc / l of one warp's m16 tile `mt` into an output tile (rows row0 + g (+8), columns
// 2t (+1) of each n8 tile), dividing element by element as the reference does; l = 0 (a row that saw
// no key) gives 0.
template <typename T, int D>
__device__ __forceinline__ void stage_rows(const SmemTile<64, D>& tile, const float (&acc)[D / 8][4],
                                           const float (&l)[2], int row0, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const bool any = l[half] != 0.0f;  // a NaN l (a NaN or Inf input) gives NaN, not an empty row
      const float a = any ? __fdiv_rn(acc[j][2 * half], l[half]) : 0.0f;
      const float b = any ? __fdiv_rn(acc[j][2 * half + 1], l[half]) : 0.0f;
      tile.store_pair(row0 + g + 8 * half, j * 8 + 2 * t, T::pack(a, b));
    }
  }
}

// kWarps = 4: 16 rows per warp, double-buffered K/V. kWarps = 2: 32 rows per warp (two m16 tiles),
// single-buffered K/V (needs one softmax sub-tile per key tile and no quantization).
// kBlockP: P's NVFP4 scales are block scales (FastVideo's production setting), known at compile
// time, so the second-level (tile/row) code and its registers are left out; otherwise p.p_scale
// picks block, tile or row at run time.
template <typename T, int D, typename Schedule, bool kQuantizeP, int kWarps, bool kBlockP = false>
__device__ __forceinline__ void attention_forward(const kern::AttentionParams& p, char* smem) {
  using Tile = SmemTile<64, D>;
  using E = typename T::Storage;
  constexpr int kThreads = kWarps * 32;
  constexpr int kMT = 4 / kWarps;  // m16 tiles per warp
  constexpr bool kSingleBuffer = kWarps == 2;
  constexpr int kSub = Schedule::kSubTile;
  constexpr int kSubTiles = kKeyTile / kSub;
  constexpr int kNT = kSub / 8;  // n8 tiles per sub-tile
  static_assert(kWarps == 4 || (kSubTiles == 1 && !kQuantizeP),
                "two-warp blocks run one softmax sub-tile per key tile, unquantized");

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int bh = blockIdx.y;
  const int b = bh / p.Hq, h = bh % p.Hq;
  const int hk = h / (p.Hq / p.Hkv);
  // Heaviest query tiles first (causal): the last tiles see the most keys.
  const int q_tile = gridDim.x - 1 - blockIdx.x;
  const int q0 = q_tile * kFwdRows;
  const int warp_row0 = warp * 16 * kMT;  // this warp's first row within the block

  // Shared memory: Q, then K[2], V[2] (double-buffered) or K, V (single-buffered), then the
  // tile-amax exchange slots.
  const Tile sq{smem_address(smem)};
  const Tile sk[2] = {Tile{sq.base + Tile::kBytes},
                      Tile{sq.base + (kSingleBuffer ? 1 : 2) * Tile::kBytes}};
  const Tile sv[2] = {Tile{sq.base + (kSingleBuffer ? 2 : 3) * Tile::kBytes},
                      Tile{sq.base + (kSingleBuffer ? 2 : 4) * Tile::kBytes}};
  float* amax_slots = reinterpret_cast<float*>(smem + (kSingleBuffer ? 3 : 5) * Tile::kBytes);
  int amax_use = 0;

  const E* qg = static_cast<const E*>(p.q.data) + b * p.q.stride_b + h * p.q.stride_h;
  const E* kg = static_cast<const E*>(p.k.data) + b * p.k.stride_b + hk * p.k.stride_h;
  const E* vg = static_cast<const E*>(p.v.data) + b * p.v.stride_b + hk * p.v.stride_h;
  auto load_k = [&](const Tile& dst, int tile_index, const Schedule& sc) {
    const int k0 = sc.key0(tile_index), n = sc.valid_keys(tile_index);
    dst.template load_async<kThreads>(kg + k0 * p.k.stride_s, p.k.stride_s, n, p.k.data);
  };
  auto load_v = [&](const Tile& dst, int tile_index, const Schedule& sc) {
    const int k0 = sc.key0(tile_index), n = sc.valid_keys(tile_index);
    dst.template load_async<kThreads>(vg + k0 * p.v.stride_s, p.v.stride_s, n, p.v.data);
  };

  Schedule sched(p, b, h, q0);
  int tile = sched.first();

  sq.template load_async<kThreads>(qg + q0 * p.q.stride_s, p.q.stride_s, p.Sq - q0, p.q.data);
  if (tile >= 0) {
    load_k(sk[0], tile, sched);
    if (!kSingleBuffer) load_v(sv[0], tile, sched);
  }
  cp_async_commit();

  float acc[kMT][D / 8][4];
  float acc_hp[kQuantizeP ? kMT : 1][kQuantizeP ? D / 8 : 1][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[mt][j][e] = 0.0f;
        if (kQuantizeP) acc_hp[mt][j][e] = 0.0f;
      }
  float m[kMT][2], l[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) m[mt][0] = m[mt][1] = -CUDART_INF_F, l[mt][0] = l[mt][1] = 0.0f;

  for (int it = 0; tile >= 0; ++it) {
    const int buf = kSingleBuffer ? 0 : it & 1;
    const int next = sched.next(tile);
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (kSingleBuffer) {
      load_v(sv[0], tile, sched);  // every warp is past the previous P·V: V's buffer is free
    } else if (next >= 0) {        // prefetch into the buffers the previous iteration used
      load_k(sk[buf ^ 1], next, sched);
      load_v(sv[buf ^ 1], next, sched);
    }
    cp_async_commit();

    const int k0 = sched.key0(tile), n_valid = sched.valid_keys(tile);
#pragma unroll
    for (int sub = 0; sub < kSubTiles; ++sub) {
      // S = Q Kᵀ for this warp's rows and the sub-tile's keys, per sub-tile so that only one
      // sub-tile of scores is live at a time (registers: QAT keeps two accumulators).
      float s[kMT][kNT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][j][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) ldmatrix_x4(a[mt], sq.a_operand(warp_row0 + 16 * mt, kk * 16, lane));
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t bk[4];
          ldmatrix_x4(bk, sk[buf].b_operand(sub * kSub + np * 16, kk * 16, lane));
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_16816<T>(s[mt][2 * np], a[mt], bk[0], bk[1]);
            mma_16816<T>(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
          }
        }
      }

      // Per m16 tile: mask, online softmax, P (quantized when asked) as A operands.
      uint32_t a_hp[kMT][kNT / 2][4], a_q[kQuantizeP ? kMT : 1][kQuantizeP ? kNT / 2 : 1][4];
      float alpha[kMT][2];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const int row_base = q0 + warp_row0 + 16 * mt + g;  // rows row_base and row_base + 8
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int slot = (sub * kNT + j) * 8 + 2 * t + (e & 1);
            if (!sched.visible(row_base + 8 * (e >> 1), k0 + slot, slot, n_valid))
              s[mt][j][e] = Schedule::kMaskedLogit;
          }
        // Second-level P scales of the tile and row modes, chosen at run time (block scales, and
        // every kBlockP kernel, keep enc = dec = 1).
        auto second_of = [&](const float (&pr)[kNT][4], SecondLevel (&second)[2]) {
          if (p.p_scale == 2) {  // row: rowmax of p over the sub-tile's real keys
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              float rmax = 0.0f;
#pragma unroll
              for (int j = 0; j < kNT; ++j) rmax = fmaxf(rmax, fmaxf(pr[j][2 * r], pr[j][2 * r + 1]));
              second[r] = nvfp4_second_level(quad_max(rmax));
            }
          } else if (p.p_scale == 1) {  // tile: amax over the 32 x 32 tile (this warp and its pair)
            float tmax = 0.0f;
#pragma unroll
            for (int j = 0; j < kNT; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e)
                if (row_base + 8 * (e >> 1) < p.Sq) tmax = nvfp4_amax_step(tmax, pr[j][e]);
            second[0] = second[1] = nvfp4_second_level(pair_max(warp_max(tmax), amax_slots, amax_use));
          }
        };
        if constexpr (kBlockP) {
          (void)second_of;
          online_softmax_step<T, kNT, kQuantizeP>(s[mt], m[mt], l[mt], alpha[mt], p.scale_log2,
                                                  a_hp[mt], a_q[kQuantizeP ? mt : 0], BlockScalesOnly{});
        } else {
          online_softmax_step<T, kNT, kQuantizeP>(s[mt], m[mt], l[mt], alpha[mt], p.scale_log2,
                                                  a_hp[mt], a_q[kQuantizeP ? mt : 0], second_of);
        }
      }

      if constexpr (kSingleBuffer) {
        // V has landed and every warp is done with K: the next K's load overlaps P·V.
        cp_async_wait<0>();
        __syncthreads();
        if (next >= 0) load_k(sk[0], next, sched);
        cp_async_commit();
      }

#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
          acc[mt][j][0] *= alpha[mt][0];
          acc[mt][j][1] *= alpha[mt][0];
          acc[mt][j][2] *= alpha[mt][1];
          acc[mt][j][3] *= alpha[mt][1];
          if constexpr (kQuantizeP) {
            acc_hp[mt][j][0] *= alpha[mt][0];
            acc_hp[mt][j][1] *= alpha[mt][0];
            acc_hp[mt][j][2] *= alpha[mt][1];
            acc_hp[mt][j][3] *= alpha[mt][1];
          }
        }
#pragma unroll
      for (int kb = 0; kb < kNT / 2; ++kb) {
        const int key_row = sub * kSub + kb * 16;
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t bv[4];
          ldmatrix_x4_trans(bv, sv[buf].b_operand_trans(key_row, dp * 16, lane));
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            if constexpr (kQuantizeP) {
              mma_16816<T>(acc[mt][2 * dp], a_q[mt][kb], bv[0], bv[1]);
              mma_16816<T>(acc[mt][2 * dp + 1], a_q[mt][kb], bv[2], bv[3]);
              mma_16816<T>(acc_hp[mt][2 * dp], a_hp[mt][kb], bv[0], bv[1]);
              mma_16816<T>(acc_hp[mt][2 * dp + 1], a_hp[mt][kb], bv[2], bv[3]);
            } else {
              mma_16816<T>(acc[mt][2 * dp], a_hp[mt][kb], bv[0], bv[1]);
              mma_16816<T>(acc[mt][2 * dp + 1], a_hp[mt][kb], bv[2], bv[3]);
            }
          }
        }
      }
    }
    tile = next;
  }

  // Epilogue: o = acc / l (and o_hp), lse = m + log2(l); a row without any visible key (VSA) gets
  // o = 0 and lse = -inf.
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with Q and K: their buffers take the output tiles
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    const int row0 = warp_row0 + 16 * mt;
    stage_rows<T, D>(sq, acc[mt], l[mt], row0, lane);
    if (p.o_hp.data != nullptr) {
      if constexpr (kQuantizeP) {
        stage_rows<T, D>(sk[0], acc_hp[mt], l[mt], row0, lane);
      } else {
        stage_rows<T, D>(sk[0], acc[mt], l[mt], row0, lane);  // plain attention: o_hp = o
      }
    }
    if (t == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = q0 + row0 + g + 8 * r;
        if (row < p.Sq)
          p.lse.data[b * p.lse.stride_b + h * p.lse.stride_h + row * p.lse.stride_s] =
              l[mt][r] != 0.0f ? m[mt][r] + log2f(l[mt][r]) : -CUDART_INF_F;
      }
    }
  }
  __syncthreads();
  E* og = static_cast<E*>(p.o.data) + b * p.o.stride_b + h * p.o.stride_h + q0 * p.o.stride_s;
  sq.template store_rows<kThreads>(og, p.o.stride_s, p.Sq - q0);
  if (p.o_hp.data != nullptr) {
    E* hg = static_cast<E*>(p.o_hp.data) + b * p.o_hp.stride_b + h * p.o_hp.stride_h +
            q0 * p.o_hp.stride_s;
    sk[0].template store_rows<kThreads>(hg, p.o_hp.stride_s, p.Sq - q0);
  }
}

}  // namespace fva::dev
