// The products of the VSA layer's coarse attention on tensor cores (mma.sync m16n8k16, fp32
// accumulation: every GPU since Ampere), for a block of kLayerCoarseThreads (512) threads, 16
// warps, that owns a tile of kLayerCoarseRows (16) rows, one m16 row block: block-vector matrices
// of a few thousand rows at most per head, whose operands are already in the dtype (block means,
// weights, their gradients), so the tensor cores see exactly the values the CPU backend multiplies;
// only the fp32 order of each sum differs (SPEC 3b's tie rule, section 4's tolerances). Sixteen
// warps because the row-wise passes between the products give each warp one row of the tile. The
// operands go through shared memory as 16-bit tiles with a pitch of D + 8 elements: 16-byte aligned
// rows whose fragment loads fall in 32 distinct banks. Every access is bounded by the rows and
// columns that exist; what lies past them is zero.
#pragma once

#include "vsa_layer/layer_common.cuh"

namespace fva::dev::layer {

constexpr int kRows = kern::kLayerCoarseRows;       // 16: one m16 row block
constexpr int kThreads = kern::kLayerCoarseThreads;  // 512
constexpr int kWarps = kThreads / 32;               // 16
static_assert(kWarps == kRows, "the row-wise passes give each warp one row of the tile");
constexpr int kColTile = 8 * kWarps;  // 128 columns of a tile of dot products: an n8 block a warp
constexpr int kSumTile = 32;          // terms of a tile of the weighted sums: two k16 steps

template <int D>
struct TileSmem {
  static constexpr int kPitch = D + 8;  // elements of a staged 16-bit row
  static constexpr int kRowElems = kRows * kPitch;                 // the tile's 16 rows
  static constexpr int kDotBytes = 2 * kColTile * kPitch;          // a column tile
  static constexpr int kSumBytes = 2 * kSumTile * kPitch;          // a term tile
  static constexpr int kHistBytes = 4 * kWarps * 256;              // a histogram per warp
  static constexpr int kMax2 = kDotBytes > kSumBytes ? kDotBytes : kSumBytes;
  static constexpr int kWorkBytes = kMax2 > kHistBytes ? kMax2 : kHistBytes;
};

// Two 16-bit values as the 32-bit word of a fragment (lo: the lower column or row).
__device__ __forceinline__ uint32_t pack16(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// Staging of a tile of `count` rows of a contiguous [n x D] matrix (rows first .. first + count - 1,
// those at or past n as zeros) into shared memory at pitch D + 8, in two halves so that the loads
// of the next tile are in flight while the current one is used: fetch() issues the global loads
// into registers, put() writes them to shared memory.
template <int D, int kCount>
struct StagedRows {
  static constexpr int kWordsPerRow = D / 8;  // 16-byte words
  static constexpr int kTotal = kCount * kWordsPerRow;
  static constexpr int kPerThread = (kTotal + kThreads - 1) / kThreads;
  uint4 v[kPerThread];
  __device__ __forceinline__ void fetch(const uint16_t* m, int n, int first) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int w = threadIdx.x + i * kThreads, r = w / kWordsPerRow, c = w % kWordsPerRow;
      v[i] = w < kTotal && first + r < n
                 ? reinterpret_cast<const uint4*>(m)[static_cast<int64_t>(first + r) * kWordsPerRow + c]
                 : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  __device__ __forceinline__ void put(uint16_t* tile) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int w = threadIdx.x + i * kThreads, r = w / kWordsPerRow, c = w % kWordsPerRow;
      if (w < kTotal) *reinterpret_cast<uint4*>(tile + r * TileSmem<D>::kPitch + 8 * c) = v[i];
    }
  }
};

// The tile's rows (rows <= 16 of them, the first rows of a contiguous [n x D] matrix of 16-bit
// elements) into a[16][D + 8]; rows past `rows` read as 0. The caller synchronizes before use.
template <int D>
__device__ __forceinline__ void load_rows(const uint16_t* m, int rows, uint16_t* a) {
  StagedRows<D, kRows> s;
  s.fetch(m, rows, 0);
  s.put(a);
}

// s[r][j] = a[r]·m[j] for r < rows and j < n, with a the tile's rows (load_rows) and m a contiguous
// [n x D] matrix: store(r, j, s) for each. Warp w takes the n8 block 8w .. 8w + 7 of each 128-column
// tile: per k16 step four words of the rows, two of the columns, one MMA. The next tile's loads are
// issued before this tile's MMAs. Ends with the block synchronized (the work region free again).
template <typename T, int D, typename Store>
__device__ __forceinline__ void rows_dot_matrix(const uint16_t* a, int rows, const uint16_t* m, int n,
                                                uint16_t* tile, Store&& store) {
  constexpr int kPW = TileSmem<D>::kPitch / 2;  // 32-bit words of a staged row
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const uint32_t* aw = reinterpret_cast<const uint32_t*>(a);
  const uint32_t* tw = reinterpret_cast<const uint32_t*>(tile);
  StagedRows<D, kColTile> next;
  next.fetch(m, n, 0);
  for (int j0 = 0; j0 < n; j0 += kColTile) {
    __syncthreads();  // the previous tile (or the caller) is done with the work region
    next.put(tile);
    __syncthreads();
    if (j0 + kColTile < n) next.fetch(m, n, j0 + kColTile);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t af[4] = {aw[g * kPW + 8 * kk + t], aw[(g + 8) * kPW + 8 * kk + t],
                              aw[g * kPW + 8 * kk + 4 + t], aw[(g + 8) * kPW + 8 * kk + 4 + t]};
      const int col = 8 * warp + g;
      mma_16816<T>(acc, af, tw[col * kPW + 8 * kk + t], tw[col * kPW + 8 * kk + 4 + t]);
    }
    const int j = j0 + 8 * warp + 2 * t;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = g + 8 * (e >> 1), jj = j + (e & 1);
      if (r < rows && jj < n) store(r, jj, acc[e]);
    }
  }
  __syncthreads();
}

// out[r][d] = Σ_{j < n} w[r][j] · m[j][d] for r < rows: w the tile's rows of a [rows x n] matrix
// of 16-bit weights with row pitch w_pitch (shared or global memory, written before the block's
// last barrier), m a contiguous [n x D] matrix; store(r, d, out) for each. Warp w < D / 8 owns the
// n8 block of columns 8w .. 8w + 7: per k16 step eight 16-bit loads of the weights, four of the
// term tile, one MMA. The next term tile's loads are issued before this tile's MMAs. Ends with the
// block synchronized.
template <typename T, int D, typename Store>
__device__ __forceinline__ void rows_times_matrix(const uint16_t* w, int64_t w_pitch, int rows,
                                                  const uint16_t* m, int n, uint16_t* tile,
                                                  Store&& store) {
  constexpr int kP = TileSmem<D>::kPitch;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const bool owns = warp < D / 8;
  auto weight = [&](int r, int j) -> uint16_t {
    return r < rows && j < n ? w[r * w_pitch + j] : uint16_t{0};
  };
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  StagedRows<D, kSumTile> next;
  next.fetch(m, n, 0);
  for (int j0 = 0; j0 < n; j0 += kSumTile) {
    __syncthreads();
    next.put(tile);
    __syncthreads();
    if (j0 + kSumTile < n) next.fetch(m, n, j0 + kSumTile);
    if (owns) {
#pragma unroll
      for (int ks = 0; ks < kSumTile / 16; ++ks) {
        const int k0 = j0 + 16 * ks;
        const uint32_t af[4] = {pack16(weight(g, k0 + 2 * t), weight(g, k0 + 2 * t + 1)),
                                pack16(weight(g + 8, k0 + 2 * t), weight(g + 8, k0 + 2 * t + 1)),
                                pack16(weight(g, k0 + 8 + 2 * t), weight(g, k0 + 9 + 2 * t)),
                                pack16(weight(g + 8, k0 + 8 + 2 * t), weight(g + 8, k0 + 9 + 2 * t))};
        const uint16_t* col = tile + 16 * ks * kP + 8 * warp + g;
        mma_16816<T>(acc, af, pack16(col[(2 * t) * kP], col[(2 * t + 1) * kP]),
                     pack16(col[(2 * t + 8) * kP], col[(2 * t + 9) * kP]));
      }
    }
  }
  if (owns) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = g + 8 * (e >> 1), d = 8 * warp + 2 * t + (e & 1);
      if (r < rows) store(r, d, acc[e]);
    }
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
