// The dK/dV kernel's stores (sm90/attention_dkdv.cuh): dK * scale and dV at the end, and each query
// tile's dSᵀ as the dQ side reads it (kStoreDs: to the workspace for
// sm90/attention_dq_from_ds.cuh; kFuseDq: to shared memory for the block's own dQ product). A
// thread's fragments follow the wgmma layout: keys slot_base and slot_base + 8, columns
// 8j + 2t + {0, 1}.
#pragma once

#include "shared/kernel_params.h"
#include "primitives/block_terms.cuh"
#include "primitives/sm90.cuh"

namespace fva::dev::sm90 {

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

// Where a pair's dSᵀ goes with kStoreDs: its tile's 4096 elements as this warpgroup holds them, 16
// bytes per thread and k16 step (a[step]), warp w's step s at uint4 (4 w + s) 32 + lane, so each
// store of a warp writes 512 contiguous bytes. sm90/attention_dq_from_ds.cuh reads them back.
__device__ __forceinline__ void store_ds_tile(uint4* tile, const uint32_t (&a)[4][4], int warp,
                                              int lane) {
#pragma unroll
  for (int step = 0; step < 4; ++step)
    tile[(4 * warp + step) * 32 + lane] =
        make_uint4(a[step][0], a[step][1], a[step][2], a[step][3]);
}

// dK * scale and dV of a thread's keys kc0 + slot_base + {0, 8} (head hk of batch b), each with its
// block's term when the VSA layer gives them (p.terms); rows past `rows`, the keys' output rows,
// are left alone, and nothing is written when the layer's record disagrees (check).
template <typename T, int D>
__device__ __forceinline__ void store_dkdv(const kern::AttentionParams& p, const RecordCheck& check,
                                           int b, int hk, int kc0,
                                           int rows, int slot_base, int t, const float (&dk)[D / 2],
                                           const float (&dv)[D / 2]) {
  using E = typename T::Storage;
  await_block_terms(p);
  if (!check.passes(p)) return;
  E* dkg = static_cast<E*>(p.dk.data) + b * p.dk.stride_b + hk * p.dk.stride_h;
  E* dvg = static_cast<E*>(p.dv.data) + b * p.dv.stride_b + hk * p.dv.stride_h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int slot = slot_base + 8 * r;
    if (slot >= rows) continue;
    const int64_t key = kc0 + slot;
    const int64_t unit = static_cast<int64_t>(b) * p.Hkv + hk;
    const RowTerms<T, D> kterm(p.terms.dk, unit, p.vsa.num_kv_blocks, key, t);
    const RowTerms<T, D> vterm(p.terms.dv, unit, p.vsa.num_kv_blocks, key, t);
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int col = j * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(dkg + key * p.dk.stride_s + col) =
          kterm.pack(p.scale * dk[4 * j + 2 * r], p.scale * dk[4 * j + 2 * r + 1], j);
      *reinterpret_cast<uint32_t*>(dvg + key * p.dv.stride_s + col) =
          vterm.pack(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1], j);
    }
  }
}

}  // namespace fva::dev::sm90
