// The products of the VSA layer's coarse attention on tensor cores (mma.sync m16n8k16, fp32
// accumulation: every GPU since Ampere), for a block of kLayerCoarseThreads (512) threads, 16
// warps, that owns a tile of kLayerCoarseRows (16) rows, one m16 row block: block-vector matrices
// of a few thousand rows at most per head, whose operands are already in the dtype (block means,
// weights, their gradients), so the tensor cores see exactly the values the CPU backend multiplies;
// only the fp32 order of each sum differs (SPEC 3b's tie rule, section 4's tolerances). Sixteen
// warps because the row-wise passes between the products give each warp one row of the tile.
//
// These kernels are short, with a block or two per SM, so a wait for global memory stalls most of
// an SM. So the other operand of a product comes into shared memory a whole chunk at a time,
// as many rows as the plan's stage holds (kern::LayerCoarseForwardParams::stage_rows: all of them
// where they fit, which at a few hundred blocks they do), by cp.async, and the copy of a product's
// first chunk is issued before the work that precedes the product (the tile's rows, the selection,
// the softmax's backward), so it is in flight meanwhile. The operands sit in shared memory as 16-bit
// rows with a pitch of D + 8 elements: 16-byte aligned rows whose fragment loads fall in 32
// distinct banks. Every access is bounded by the rows and columns that exist; the rows past them
// are copied as zeros.
#pragma once

#include "vsa_layer/layer_common.cuh"

namespace fva::dev::layer {

constexpr int kRows = kern::kLayerCoarseRows;       // 16: one m16 row block
constexpr int kThreads = kern::kLayerCoarseThreads;  // 512
constexpr int kWarps = kThreads / 32;               // 16
static_assert(kWarps == kRows, "the row-wise passes give each warp one row of the tile");

// The tile of kRows q blocks that a q-side block of the coarse kernels covers (grid: x the tiles,
// y the (b, q head) units), from either direction's parameter block (Hq, Hkv, nq, nkv): its q
// blocks i0 .. i0 + rows - 1 (rows <= 0: the block has none), their first row in the [B, Hq, nq,
// *] matrices (q_row0), and its kv head's first row in the [B, Hkv, nkv, *] ones (kv0).
struct CoarseQTile {
  int b, h, hk, i0, rows;
  int64_t q_row0, kv0;
  template <typename Params>
  __device__ __forceinline__ explicit CoarseQTile(const Params& p) {
    const int bh = blockIdx.y;
    b = bh / p.Hq;
    h = bh % p.Hq;
    hk = h / (p.Hq / p.Hkv);
    i0 = blockIdx.x * kRows;
    rows = min(kRows, p.nq - i0);
    q_row0 = static_cast<int64_t>(bh) * p.nq + i0;
    kv0 = (static_cast<int64_t>(b) * p.Hkv + hk) * p.nkv;
  }
};

template <int D>
struct TileSmem {
  static constexpr int kPitch = D + 8;              // elements of a staged 16-bit row
  static constexpr int kRowElems = kRows * kPitch;  // the tile's 16 rows
};

// Two 16-bit values as the 32-bit word of a fragment (lo: the lower column or row).
__device__ __forceinline__ uint32_t pack16(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// The rows of a chunk, rounded up to whole k16 steps.
__device__ __forceinline__ int round16(int n) { return (n + 15) & ~15; }

// Issues (cp.async, uncommitted) the copy of rows first .. first + count - 1 of a contiguous
// [n x D] matrix of 16-bit elements into dst at pitch D + 8; rows at or past n become zeros.
template <int D>
__device__ __forceinline__ void copy_rows_async(const uint16_t* m, int n, int first, int count,
                                                uint16_t* dst) {
  constexpr int kWords = D / 8;  // 16-byte words of a row
  const int total = count * kWords;
  for (int w = threadIdx.x; w < total; w += kThreads) {
    const int r = w / kWords, c = w % kWords;
    const bool valid = first + r < n;
    const uint16_t* src = m + static_cast<int64_t>(valid ? first + r : 0) * D + 8 * c;
    cp_async_16(smem_address(dst + r * TileSmem<D>::kPitch + 8 * c), src, valid);
  }
}

// The real-token counts of a tile's blocks first .. first + count - 1 (count <= 16) into tokens[16],
// 0 past count, by the block's first 16 threads; read after the block's next barrier.
__device__ __forceinline__ void load_tile_tokens(int* tokens, const int32_t* sizes, int64_t stride,
                                                 int first, int count) {
  if (threadIdx.x < kRows)
    tokens[threadIdx.x] = static_cast<int>(threadIdx.x) < count
                              ? block_tokens(sizes, stride, first + static_cast<int>(threadIdx.x))
                              : 0;
}

// Issues and commits (with any copies the caller issued just before) the copy of the first chunk of
// a product's [n x D] matrix m into the stage: what stage_chunk waits for at j0 = 0.
template <int D>
__device__ __forceinline__ void issue_first_chunk(const uint16_t* m, int n, uint16_t* stage, int stage_rows) {
  copy_rows_async<D>(m, n, 0, round16(min(stage_rows, n)), stage);
  cp_async_commit();
}

// The chunk of a product's matrix that starts at row j0: its rows. The first chunk's copy is the
// caller's (issue_first_chunk, issued ahead of the work before the product); later chunks' copies
// (copy_rows_async, rounded up to whole k16 steps) are issued here. Waits for the chunk's copy and
// synchronizes the block.
template <int D>
__device__ __forceinline__ int stage_chunk(const uint16_t* m, int n, int j0, uint16_t* stage,
                                           int stage_rows) {
  const int count = min(stage_rows, n - j0);
  if (j0 > 0) {
    __syncthreads();  // the stage's previous chunk is consumed
    copy_rows_async<D>(m, n, j0, round16(count), stage);
    cp_async_commit();
  }
  cp_async_wait<0>();
  __syncthreads();
  return count;
}

// s[r][j] = a[r]·m[j] for r < rows and j < n, with a the tile's rows in shared memory (pitch D + 8)
// and m a contiguous [n x D] matrix, staged a chunk at a time (stage_chunk): store(r, j, s) for
// each. The warps take the chunk's n8 blocks in turn: per k16 step four words of the rows, two of
// the columns, one MMA. Ends with the block synchronized (the stage free again).
template <typename T, int D, typename Store>
__device__ __forceinline__ void rows_dot_matrix(const uint16_t* a, int rows, const uint16_t* m, int n,
                                                uint16_t* stage, int stage_rows,
                                                Store&& store) {
  constexpr int kPW = TileSmem<D>::kPitch / 2;  // 32-bit words of a staged row
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const uint32_t* aw = reinterpret_cast<const uint32_t*>(a);
  const uint32_t* sw = reinterpret_cast<const uint32_t*>(stage);
  for (int j0 = 0; j0 < n; j0 += stage_rows) {
    const int count = stage_chunk<D>(m, n, j0, stage, stage_rows);
    for (int c0 = 8 * warp; c0 < count; c0 += 8 * kWarps) {
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const int col = c0 + g;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t af[4] = {aw[g * kPW + 8 * kk + t], aw[(g + 8) * kPW + 8 * kk + t],
                                aw[g * kPW + 8 * kk + 4 + t], aw[(g + 8) * kPW + 8 * kk + 4 + t]};
        mma_16816<T>(acc, af, sw[col * kPW + 8 * kk + t], sw[col * kPW + 8 * kk + 4 + t]);
      }
      const int j = j0 + c0 + 2 * t;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = g + 8 * (e >> 1), jj = j + (e & 1);
        if (r < rows && jj < n) store(r, jj, acc[e]);
      }
    }
  }
  cp_async_wait<0>();  // n = 0: the first chunk's (empty) group
  __syncthreads();
}

// The tile's rows of a [rows x n] matrix of 16-bit values, kept in shared memory while they fit
// (kern::LayerCoarseForwardParams::rows_in_smem), else in their global home: row r at
// base + r * pitch either way. In shared memory the pitch is kern::layer_coarse_row_pitch(n): whole
// k16 steps plus 8 elements, so that rows_times_matrix's ldmatrix reads 16-byte aligned rows in
// distinct banks, and zero_padding() makes what lies past the rows and columns that exist read as
// zeros; at home the pitch is n (contiguous rows). copy_home() writes the shared rows to their
// home (the caller synchronizes first) and copy_from_home() reads them back from it (the caller
// synchronizes after); with the rows at home both do nothing.
struct TileRows {
  uint16_t* base;
  int64_t pitch;
  uint16_t* home;
  int64_t n;
  bool in_smem;
  __device__ __forceinline__ TileRows(uint16_t* smem, uint16_t* global_rows, int64_t cols, bool use_smem)
      : base(use_smem ? smem : global_rows),
        pitch(use_smem ? kern::layer_coarse_row_pitch(cols) : cols),
        home(global_rows),
        n(cols),
        in_smem(use_smem) {}
  __device__ __forceinline__ uint16_t* row(int r) const { return base + r * pitch; }
  // Zeros over the columns n .. pitch - 1 of every row and all of rows `rows` .. 15 (shared
  // memory only; the products write and read the rest), a warp per row, the lanes over its columns
  // (in shared memory the pitch fits an int).
  __device__ __forceinline__ void zero_padding(int rows) const {
    if (!in_smem) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int p = static_cast<int>(pitch), cols = static_cast<int>(n);
    for (int r = warp; r < kRows; r += kWarps) {
      uint16_t* const row = base + r * p;
      for (int j = (r < rows ? cols : 0) + lane; j < p; j += 32) row[j] = 0;
    }
  }
  // A warp per row, the lanes over its columns.
  __device__ __forceinline__ void copy_home(int rows) const {
    if (!in_smem) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int r = warp; r < rows; r += kWarps)
      for (int64_t j = lane; j < n; j += 32) home[r * n + j] = base[r * pitch + j];
  }
  __device__ __forceinline__ void copy_from_home(int rows) const {
    if (!in_smem) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int cols = static_cast<int>(n);
    for (int r = warp; r < rows; r += kWarps)
      for (int j = lane; j < cols; j += 32) row(r)[j] = home[static_cast<int64_t>(r) * n + j];
  }
};

// out[r][d] = Σ_{j < n} w[r][j] · m[j][d] for r < rows: w the tile's rows of a [rows x n] matrix
// of 16-bit weights (TileRows, written before the block's last barrier), m a contiguous [n x D]
// matrix, staged a chunk at a time (stage_chunk); store(r, d, out) for each. Warp w < D / 8 owns
// the n8 block of columns 8w .. 8w + 7: per k16 step the weights' A fragment (one ldmatrix where
// the rows are in shared memory, whose padding reads as zeros; else eight bounded 16-bit loads),
// the staged rows' B fragment (one ldmatrix.trans of the 16 k rows at the warp's 8 columns), one
// MMA. Ends with the block synchronized.
template <typename T, int D, typename Store>
__device__ __forceinline__ void rows_times_matrix(const TileRows& w, int rows, const uint16_t* m, int n,
                                                  uint16_t* stage, int stage_rows,
                                                  Store&& store) {
  constexpr int kP = TileSmem<D>::kPitch;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const bool owns = warp < D / 8;
  // ldmatrix: lane l gives the address of row l % 16 at column 8 (l / 16) of the k16 step.
  const uint32_t w_lane = w.in_smem ? smem_address(w.base + (lane % 16) * w.pitch + (lane / 16) * 8) : 0u;
  // ldmatrix.trans: lane l < 16 gives the address of staged row l at the warp's columns.
  const uint32_t b_lane = smem_address(stage + (lane % 16) * kP + 8 * warp);
  auto weight = [&](int r, int j) -> uint16_t {
    return r < rows && j < n ? w.base[r * w.pitch + j] : uint16_t{0};
  };
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int j0 = 0; j0 < n; j0 += stage_rows) {
    const int count = stage_chunk<D>(m, n, j0, stage, stage_rows);
    if (!owns) continue;
    for (int k0 = 0; k0 < count; k0 += 16) {
      const int j = j0 + k0;
      uint32_t af[4];
      if (w.in_smem) {
        ldmatrix_x4(af, w_lane + 2 * j);
      } else {
        af[0] = pack16(weight(g, j + 2 * t), weight(g, j + 2 * t + 1));
        af[1] = pack16(weight(g + 8, j + 2 * t), weight(g + 8, j + 2 * t + 1));
        af[2] = pack16(weight(g, j + 8 + 2 * t), weight(g, j + 9 + 2 * t));
        af[3] = pack16(weight(g + 8, j + 8 + 2 * t), weight(g + 8, j + 9 + 2 * t));
      }
      uint32_t bf[2];
      ldmatrix_x2_trans(bf, b_lane + 2 * k0 * kP);
      mma_16816<T>(acc, af, bf[0], bf[1]);
    }
  }
  cp_async_wait<0>();
  if (owns) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = g + 8 * (e >> 1), d = 8 * warp + 2 * t + (e & 1);
      if (r < rows) store(r, d, acc[e]);
    }
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
