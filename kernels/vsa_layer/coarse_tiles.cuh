// The small products of the VSA layer's coarse attention, for a block of kLayerCoarseThreads (512)
// threads, 16 warps, that owns a tile of kLayerCoarseRows (16) rows: block-vector matrices of a few
// thousand rows at most per head, so plain fp32 FMAs from shared memory, each sum in ascending order
// of its index (layer_common.cuh's step), as the CPU backend adds them. Sixteen warps, not four,
// because these products are short and latency-bound: the row-wise passes give each warp one row,
// and the products keep enough independent FMA chains in flight per SM. Every access is bounded by
// the rows and columns that exist.
#pragma once

#include "vsa_layer/layer_common.cuh"

namespace fva::dev::layer {

constexpr int kRows = kern::kLayerCoarseRows;       // 16
constexpr int kThreads = kern::kLayerCoarseThreads;  // 512
constexpr int kWarps = kThreads / 32;               // 16
static_assert(kWarps == kRows, "the row-wise passes give each warp one row of the tile");
constexpr int kColTile = 128;  // columns of a tile of dot products
constexpr int kSumTile = 32;   // terms of a tile of the weighted sums

// Shared memory of one block: the 16 rows in fp32 (RowTile), then a work region that the two
// products and the row-wise passes' histograms take turns on.
template <int D>
struct TileSmem {
  static constexpr int kColPitch = D + 2;  // 16-bit elements per column row: conflict-free words
  static constexpr int kDotFloats = kColTile * kColPitch / 2;         // the column tile, 16-bit
  static constexpr int kSumFloats = kSumTile * D + kRows * kSumTile;  // the matrix tile, weights
  static constexpr int kHistFloats = kWarps * 256;                    // a histogram per warp
  static constexpr int kMax2 = kDotFloats > kSumFloats ? kDotFloats : kSumFloats;
  static constexpr int kWorkFloats = kMax2 > kHistFloats ? kMax2 : kHistFloats;
};

// The tile's rows (rows <= 16 of them, the first rows of a contiguous [n x D] matrix of 16-bit
// elements) into a[D][16] as fp32, transposed (a column's 16 rows side by side, so that a thread
// reads four rows in one 16-byte load); rows past `rows` read as 0.
template <typename T, int D>
__device__ __forceinline__ void load_rows(const uint16_t* m, int rows, float* a) {
  for (int w = threadIdx.x; w < kRows * D / 2; w += kThreads) {
    const int r = w / (D / 2), c = w % (D / 2);
    const uint32_t v = r < rows ? reinterpret_cast<const uint32_t*>(m)[static_cast<int64_t>(r) * (D / 2) + c] : 0u;
    a[(2 * c) * kRows + r] = lo<T>(v);
    a[(2 * c + 1) * kRows + r] = hi<T>(v);
  }
}

// s[r][j] = a[r]·m[j] (fp32, d ascending) for r < rows and j < n, with a the tile's rows in shared
// memory (load_rows: transposed, 16-byte aligned) and m a contiguous [n x D] matrix: store(r, j, s)
// for each. A tile of 128 columns stays 16-bit in shared memory (pitch D + 2, so a warp's 32
// columns fall in 32 banks); warp w computes rows 4 (w % 4) .. + 3 against column 32 (w / 4) + lane:
// per two d one word of the column, two broadcast loads of the rows, eight FMAs. Ends with the block
// synchronized (the work region free again).
template <typename T, int D, typename Store>
__device__ __forceinline__ void rows_dot_matrix(const float* a, int rows, const uint16_t* m, int n,
                                                float* work, Store&& store) {
  constexpr int kPitch = TileSmem<D>::kColPitch;
  constexpr int kWordsPerRow = D / 8;  // 16-byte words of a global row
  uint32_t* tile = reinterpret_cast<uint32_t*>(work);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = 4 * (warp & 3), col = 32 * (warp >> 2) + lane;
  // The next tile's loads are issued before this tile's FMAs, so their latency hides under them.
  constexpr int kLoads = kColTile * kWordsPerRow / kThreads;  // 16-byte words a thread moves
  static_assert(kColTile * kWordsPerRow % kThreads == 0, "whole tiles per thread");
  uint4 next[kLoads];
  auto fetch = [&](int j0) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int w = threadIdx.x + i * kThreads, jj = w / kWordsPerRow, c = w % kWordsPerRow;
      next[i] = j0 + jj < n ? reinterpret_cast<const uint4*>(m)[static_cast<int64_t>(j0 + jj) * kWordsPerRow + c]
                            : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  fetch(0);
  for (int j0 = 0; j0 < n; j0 += kColTile) {
    __syncthreads();  // the previous tile (or the caller) is done with the work region
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int w = threadIdx.x + i * kThreads, jj = w / kWordsPerRow, c = w % kWordsPerRow;
      uint32_t* dst = tile + jj * (kPitch / 2) + 4 * c;
      dst[0] = next[i].x, dst[1] = next[i].y, dst[2] = next[i].z, dst[3] = next[i].w;
    }
    __syncthreads();
    if (j0 + kColTile < n) fetch(j0 + kColTile);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint32_t* c0 = tile + col * (kPitch / 2);
    const float* a0 = a + row0;  // the warp's four rows of column d: a0[d * 16 .. + 3]
#pragma unroll 8
    for (int d2 = 0; d2 < D / 2; ++d2) {
      const uint32_t kw = c0[d2];
      const float k[2] = {lo<T>(kw), hi<T>(kw)};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float4 x = *reinterpret_cast<const float4*>(a0 + (2 * d2 + e) * kRows);  // broadcast
        acc[0] = step(acc[0], x.x, k[e]);
        acc[1] = step(acc[1], x.y, k[e]);
        acc[2] = step(acc[2], x.z, k[e]);
        acc[3] = step(acc[3], x.w, k[e]);
      }
    }
    const int j = j0 + col;
#pragma unroll
    for (int r = 0; r < 4; ++r)
      if (row0 + r < rows && j < n) store(row0 + r, j, acc[r]);
  }
  __syncthreads();
}

// out[r][d] = Σ_{j < n} w[r][j] · m[j][d] (fp32, j ascending) for r < rows: w the tile's rows of a
// [rows x n] matrix of 16-bit weights with row pitch w_pitch (shared or global memory, written
// before the block's last barrier), m a contiguous [n x D] matrix; store(r, d, out) for each.
// Thread t owns column t % D of rows (t / D) * R .. + R - 1, R = 16 D / 512 (4 or 2): per term one
// conflict-free load, one broadcast load of the weights, R FMAs. Ends with the block synchronized.
template <typename T, int D, typename Store>
__device__ __forceinline__ void rows_times_matrix(const uint16_t* w, int64_t w_pitch, int rows,
                                                  const uint16_t* m, int n, float* work,
                                                  Store&& store) {
  constexpr int kGroups = kThreads / D;  // 4 (D = 128) or 8 (D = 64)
  constexpr int kPerThread = kRows / kGroups;
  static_assert(kPerThread == 4 || kPerThread == 2, "one 16- or 8-byte load of a term's weights");
  float* mt = work;                 // [kSumTile][D]
  float* wt = work + kSumTile * D;  // [kSumTile][kRows]: a term's weights of the 16 rows together
  const int d = threadIdx.x % D, g = threadIdx.x / D;
  float acc[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) acc[i] = 0.0f;
  // The next tile's loads are issued before this tile's FMAs, so their latency hides under them.
  constexpr int kMLoads = kSumTile * D / 2 / kThreads;  // 32-bit words of m a thread moves
  constexpr int kWLoads = kRows * kSumTile / kThreads;  // weights a thread moves
  static_assert(kMLoads * kThreads == kSumTile * D / 2 && kWLoads * kThreads == kRows * kSumTile,
                "whole tiles per thread");
  uint32_t next_m[kMLoads];
  uint16_t next_w[kWLoads];
  auto fetch = [&](int j0) {
#pragma unroll
    for (int i = 0; i < kMLoads; ++i) {
      const int e = threadIdx.x + i * kThreads, jj = e / (D / 2), c = e % (D / 2);
      next_m[i] = j0 + jj < n ? reinterpret_cast<const uint32_t*>(m)[static_cast<int64_t>(j0 + jj) * (D / 2) + c] : 0u;
    }
#pragma unroll
    for (int i = 0; i < kWLoads; ++i) {
      const int e = threadIdx.x + i * kThreads, r = e / kSumTile, jj = e % kSumTile;
      next_w[i] = r < rows && j0 + jj < n ? w[r * w_pitch + j0 + jj] : uint16_t{0};
    }
  };
  fetch(0);
  for (int j0 = 0; j0 < n; j0 += kSumTile) {
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kMLoads; ++i) {
      const int e = threadIdx.x + i * kThreads, jj = e / (D / 2), c = e % (D / 2);
      mt[jj * D + 2 * c] = lo<T>(next_m[i]);
      mt[jj * D + 2 * c + 1] = hi<T>(next_m[i]);
    }
#pragma unroll
    for (int i = 0; i < kWLoads; ++i) {
      const int e = threadIdx.x + i * kThreads, r = e / kSumTile, jj = e % kSumTile;
      wt[jj * kRows + r] = Elem<T>::value(next_w[i]);  // 0 bits (+0) outside the tile
    }
    __syncthreads();
    if (j0 + kSumTile < n) fetch(j0 + kSumTile);
    const int count = min(kSumTile, n - j0);
    for (int jj = 0; jj < count; ++jj) {
      const float mv = mt[jj * D + d];
      const float* wr = wt + jj * kRows + g * kPerThread;  // broadcast within the warp
      if constexpr (kPerThread == 4) {
        const float4 w4 = *reinterpret_cast<const float4*>(wr);
        acc[0] = step(acc[0], w4.x, mv);
        acc[1] = step(acc[1], w4.y, mv);
        acc[2] = step(acc[2], w4.z, mv);
        acc[3] = step(acc[3], w4.w, mv);
      } else {
        const float2 w2 = *reinterpret_cast<const float2*>(wr);
        acc[0] = step(acc[0], w2.x, mv);
        acc[1] = step(acc[1], w2.y, mv);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int row = g * kPerThread + i;
    if (row < rows) store(row, d, acc[i]);
  }
  __syncthreads();
}

// The tile's rows of a [rows x n] matrix of 16-bit values, kept in shared memory while they fit
// (kern::LayerCoarseForwardParams::rows_in_smem), else in their global home: row r at
// base + r * n either way. copy_home() writes the shared rows to their global home (the caller
// synchronizes first); with the rows at home already it does nothing.
struct TileRows {
  uint16_t* base;
  uint16_t* home;
  int64_t n;
  bool in_smem;
  __device__ __forceinline__ TileRows(uint16_t* smem, uint16_t* global_rows, int64_t cols, bool use_smem)
      : base(use_smem ? smem : global_rows), home(global_rows), n(cols), in_smem(use_smem) {}
  __device__ __forceinline__ uint16_t* row(int r) const { return base + r * n; }
  __device__ __forceinline__ void copy_home(int rows) const {
    if (!in_smem) return;
    const int64_t elems = rows * n;
    // Both regions start 16-byte aligned when n is a multiple of 8 (the host pads nothing: the
    // global rows are contiguous); otherwise element by element.
    if ((n & 7) == 0) {
      const uint4* src = reinterpret_cast<const uint4*>(base);
      uint4* dst = reinterpret_cast<uint4*>(home);
      for (int64_t e = threadIdx.x; e < elems / 8; e += kThreads) dst[e] = src[e];
    } else {
      for (int64_t e = threadIdx.x; e < elems; e += kThreads) home[e] = base[e];
    }
  }
};

// ---- warp-wide helpers ---------------------------------------------------------------------------

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
// The same butterfly on every lane: every lane gets the same bits.
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

}  // namespace fva::dev::layer
