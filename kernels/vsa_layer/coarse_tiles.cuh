// The small products of the VSA layer's coarse attention, for a block of kLayerCoarseThreads (128)
// threads that owns a tile of kLayerCoarseRows (16) rows: block-vector matrices of a few thousand
// rows at most per head, so plain fp32 FMAs from shared memory, each sum in ascending order of its
// index (layer_common.cuh's step). Every access is bounded by the rows and columns that exist.
#pragma once

#include "vsa_layer/layer_common.cuh"

namespace fva::dev::layer {

constexpr int kRows = kern::kLayerCoarseRows;       // 16
constexpr int kThreads = kern::kLayerCoarseThreads;  // 128
constexpr int kColTile = 64;  // columns of a tile of dot products
constexpr int kSumTile = 32;  // terms of a tile of the weighted sums

// Shared memory of one block: the 16 rows in fp32, then a region the two products take turns on.
template <int D>
struct TileSmem {
  static constexpr int kDotFloats = kColTile * (D + 1);             // the column tile, padded
  static constexpr int kSumFloats = kSumTile * D + kRows * kSumTile;  // the matrix tile, weights
  static constexpr int kWorkFloats = kDotFloats > kSumFloats ? kDotFloats : kSumFloats;
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
// for each. Warp w computes rows 4w..4w+3 against columns lane and lane + 32 of each 64-column tile:
// per d two conflict-free loads of the columns, one broadcast load of the rows, eight FMAs. Ends
// with the block synchronized (the work region free again).
template <typename T, int D, typename Store>
__device__ __forceinline__ void rows_dot_matrix(const float* a, int rows, const uint16_t* m, int n,
                                                float* work, Store&& store) {
  constexpr int kPitch = D + 1;  // conflict-free column reads
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int j0 = 0; j0 < n; j0 += kColTile) {
    __syncthreads();  // the previous tile (or the caller) is done with the work region
    for (int w = threadIdx.x; w < kColTile * D / 2; w += kThreads) {
      const int jj = w / (D / 2), c = w % (D / 2);
      const uint32_t v = j0 + jj < n
                             ? reinterpret_cast<const uint32_t*>(m)[static_cast<int64_t>(j0 + jj) * (D / 2) + c]
                             : 0u;
      work[jj * kPitch + 2 * c] = lo<T>(v);
      work[jj * kPitch + 2 * c + 1] = hi<T>(v);
    }
    __syncthreads();
    float acc[4][2];
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = 0.0f;
    const float* c0 = work + lane * kPitch;
    const float* c1 = work + (lane + 32) * kPitch;
    const float* a0 = a + 4 * warp;  // the warp's four rows of column d: a0[d * 16 .. + 3]
#pragma unroll 8
    for (int d = 0; d < D; ++d) {
      const float k0 = c0[d], k1 = c1[d];
      const float4 x4 = *reinterpret_cast<const float4*>(a0 + d * kRows);  // one broadcast load
      const float x[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        acc[r][0] = step(acc[r][0], x[r], k0);
        acc[r][1] = step(acc[r][1], x[r], k1);
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = 4 * warp + r;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = j0 + lane + 32 * h;
        if (row < rows && j < n) store(row, j, acc[r][h]);
      }
    }
  }
  __syncthreads();
}

// out[r][d] = Σ_{j < n} w[r][j] · m[j][d] (fp32, j ascending) for r < rows: w the tile's rows of a
// [rows x n] matrix of 16-bit weights with row pitch w_pitch (global memory, written before the
// block's last barrier), m a contiguous [n x D] matrix; store(r, d, out) for each. Thread t owns
// column t % D of rows (t / D) * R .. + R - 1, R = 16 * D / 128: per term one conflict-free load,
// R / 4 broadcast loads of the weights, R FMAs. Ends with the block synchronized.
template <typename T, int D, typename Store>
__device__ __forceinline__ void rows_times_matrix(const uint16_t* w, int64_t w_pitch, int rows,
                                                  const uint16_t* m, int n, float* work,
                                                  Store&& store) {
  constexpr int kGroups = kThreads / D;  // 1 (D = 128) or 2 (D = 64)
  constexpr int kPerThread = kRows / kGroups;
  float* mt = work;                    // [kSumTile][D]
  float* wt = work + kSumTile * D;     // [kSumTile][kRows]: a term's weights of the 16 rows together
  const int d = threadIdx.x % D, g = threadIdx.x / D;
  float acc[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) acc[i] = 0.0f;
  for (int j0 = 0; j0 < n; j0 += kSumTile) {
    __syncthreads();
    for (int e = threadIdx.x; e < kSumTile * D / 2; e += kThreads) {
      const int jj = e / (D / 2), c = e % (D / 2);
      const uint32_t v = j0 + jj < n
                             ? reinterpret_cast<const uint32_t*>(m)[static_cast<int64_t>(j0 + jj) * (D / 2) + c]
                             : 0u;
      mt[jj * D + 2 * c] = lo<T>(v);
      mt[jj * D + 2 * c + 1] = hi<T>(v);
    }
    for (int e = threadIdx.x; e < kRows * kSumTile; e += kThreads) {
      const int r = e / kSumTile, jj = e % kSumTile;  // coalesced along the weights' rows
      wt[jj * kRows + r] = r < rows && j0 + jj < n ? Elem<T>::value(w[r * w_pitch + j0 + jj]) : 0.0f;
    }
    __syncthreads();
    const int count = min(kSumTile, n - j0);
    for (int jj = 0; jj < count; ++jj) {
      const float mv = mt[jj * D + d];
      const float* wr = wt + jj * kRows + g * kPerThread;  // broadcast within the warp
#pragma unroll
      for (int i4 = 0; i4 < kPerThread; i4 += 4) {
        const float4 w4 = *reinterpret_cast<const float4*>(wr + i4);
        acc[i4] = step(acc[i4], w4.x, mv);
        acc[i4 + 1] = step(acc[i4 + 1], w4.y, mv);
        acc[i4 + 2] = step(acc[i4 + 2], w4.z, mv);
        acc[i4 + 3] = step(acc[i4 + 3], w4.w, mv);
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
