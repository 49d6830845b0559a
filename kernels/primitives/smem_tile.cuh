// A [ROWS x D] tile of 16-bit elements in shared memory, swizzled so that ldmatrix and the
// 16-byte async copies are free of bank conflicts: the 16-byte chunk c of row r is stored at chunk
// position c ^ (r % 8) of that row. Loads from and stores to strided global rows, with rows past
// the valid count zero-filled (loads) or skipped (stores).
#pragma once

#include <stdint.h>

#include "primitives/sm80.cuh"

namespace fva::dev {

template <int ROWS, int D>
struct SmemTile {
  static_assert(D % 64 == 0, "rows of at least 8 chunks: the swizzle needs them");
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kBytes = ROWS * D * 2;

  uint32_t base;  // shared-memory address of the tile

  __device__ __forceinline__ uint32_t chunk(int row, int c) const {
    return base + static_cast<uint32_t>((row * kChunks + (c ^ (row & 7))) * 16);
  }

  // ldmatrix address of this lane for an A operand (16 rows from row0, k columns k0..k0+15).
  __device__ __forceinline__ uint32_t a_operand(int row0, int k0, int lane) const {
    return chunk(row0 + (lane & 15), (k0 >> 3) + (lane >> 4));
  }
  // For a B operand stored n-major (rows are n, columns k): two n8 tiles (n0.., n0+8..) x k16.
  __device__ __forceinline__ uint32_t b_operand(int n0, int k0, int lane) const {
    return chunk(n0 + (lane & 7) + ((lane >> 4) << 3), (k0 >> 3) + ((lane >> 3) & 1));
  }
  // For a B operand stored k-major (rows are k, columns n), loaded with ldmatrix .trans: k16 x two
  // n8 tiles (n0.., n0+8..).
  __device__ __forceinline__ uint32_t b_operand_trans(int k0, int n0, int lane) const {
    return chunk(k0 + (lane & 7) + (((lane >> 3) & 1) << 3), (n0 >> 3) + (lane >> 4));
  }

  // Starts the async copy of rows [0, ROWS) from global rows src + r * stride (elements); rows at
  // or past `valid` become zeros. `safe` is any valid global address (used, never read, for them).
  template <int THREADS, typename E>
  __device__ __forceinline__ void load_async(const E* src, int64_t stride, int valid,
                                             const void* safe) const {
    for (int i = threadIdx.x; i < ROWS * kChunks; i += THREADS) {
      const int r = i / kChunks, c = i % kChunks;
      const bool ok = r < valid;
      cp_async_16(chunk(r, c), ok ? static_cast<const void*>(src + r * stride + c * 8) : safe, ok);
    }
  }

  // Writes two values (packed 16-bit pair) at (row, col), col even: the accumulator layout's pairs.
  __device__ __forceinline__ void store_pair(int row, int col, uint32_t packed) const {
    const uint32_t addr = chunk(row, col >> 3) + static_cast<uint32_t>((col & 7) * 2);
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(packed));
  }

  // Copies rows [0, valid) of the tile to global rows dst + r * stride, 16 bytes at a time.
  template <int THREADS, typename E>
  __device__ __forceinline__ void store_rows(E* dst, int64_t stride, int valid) const {
    for (int i = threadIdx.x; i < ROWS * kChunks; i += THREADS) {
      const int r = i / kChunks, c = i % kChunks;
      if (r >= valid) continue;
      uint4 v;
      asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(chunk(r, c)));
      *reinterpret_cast<uint4*>(dst + r * stride + c * 8) = v;
    }
  }
};

}  // namespace fva::dev
