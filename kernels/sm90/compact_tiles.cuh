// Shared memory of the compact sm_90a kernels (one warpgroup per block, no producer warpgroup,
// several blocks per SM: the VSA forward and the dQ kernel of both backwards): kTiles tiles of 64
// rows x D, each D / 64 swizzled 64-column regions of 8 KiB (1024-byte aligned), then three
// mbarriers: the query-side tiles (loaded once), K, V. With kOnesRegion (the VSA forward) an 8 KiB
// region of ones follows the last tile (V), read as the next 64-column region of P·V's B operand
// (N = D + 8), and the barriers live in bytes of it no product reads. Thread 0 issues every load;
// each barrier completes once per load, so the K and V barriers' parity flips once per listed key
// tile.
#pragma once

#include "shared/kernel_params.h"
#include "primitives/sm90.cuh"

namespace fva::dev::sm90 {

// Where a compact block works: (b, q head h) = blockIdx.y (bh = b Hq + h), the K/V head hk, and 64
// query rows from row0, the last row tiles first (causal QAT: they see the most keys).
struct CompactBlock {
  int bh, b, h, hk, row0;
  __device__ __forceinline__ explicit CompactBlock(const kern::AttentionParams& p)
      : CompactBlock(p, blockIdx.x, blockIdx.y) {}
  // From the block's index as given (a kernel may pass fresh, opaque reads of it).
  __device__ __forceinline__ CompactBlock(const kern::AttentionParams& p, uint32_t x, uint32_t y)
      : bh(static_cast<int>(y)),
        b(bh / p.Hq),
        h(bh % p.Hq),
        hk(h / (p.Hq / p.Hkv)),
        row0(static_cast<int>(gridDim.x - 1 - x) * 64) {}
};

template <int D, int kTiles, bool kOnesRegion = false>
struct CompactTiles {
  static constexpr int kRegionBytes = 64 * 128;
  static constexpr int kRegions = D / 64;
  static constexpr int kTileBytes = kRegions * kRegionBytes;
  static_assert(kern::sm90_compact_smem_bytes(D, kTiles, kOnesRegion) ==
                    kTiles * kTileBytes + (kOnesRegion ? kRegionBytes : 3 * 8),
                "host and device disagree on the shared-memory layout");

  uint32_t base;  // the block's dynamic shared memory (1024-byte aligned)

  __device__ __forceinline__ uint32_t tile(int i) const { return base + i * kTileBytes; }
  // kOnesRegion: the region after the last tile. A product of N = D + 8 reads, of its 64 rows of
  // 128 bytes, the 16-byte chunk that holds columns 0-7 under the 128-byte swizzle (row r: chunk
  // r % 8); those chunks hold ones, and row 0's chunks 1-7 hold the barriers.
  __device__ __forceinline__ uint32_t ones_region() const {
    static_assert(kOnesRegion, "a layout without a region of ones");
    return base + kTiles * kTileBytes;
  }
  __device__ __forceinline__ uint32_t bar_query() const {
    return base + kTiles * kTileBytes + (kOnesRegion ? 16 : 0);
  }
  __device__ __forceinline__ uint32_t bar_k() const { return bar_query() + 8; }
  __device__ __forceinline__ uint32_t bar_v() const { return bar_query() + 16; }

  // kOnesRegion: the ones (T's 1.0) that products read (store_ones_row), by threads 0..63 (a row
  // each; the others do nothing), fenced for the tensor cores; complete at the block's next
  // barrier. They do not touch row 0's other chunks, so the barriers may be initialized at the
  // same time.
  template <typename T>
  __device__ __forceinline__ void fill_ones_region() const {
    const int r = static_cast<int>(threadIdx.x);
    if (r >= 64) return;
    store_ones_row<T>(ones_region(), r);
    fence_proxy_async();
  }

  // Thread 0, before the block's first __syncthreads.
  __device__ __forceinline__ void init_barriers() const {
    mbar_init(bar_query(), 1);
    mbar_init(bar_k(), 1);
    mbar_init(bar_v(), 1);
    mbar_fence_init();
  }

  // Thread 0: rows [row, row + 64) of (head, b) of `map` into tile `dst`, completing `bar` (armed
  // here for `arm_tiles` tiles: a barrier that waits for several loads is armed by the first).
  __device__ __forceinline__ void load(int dst, const kern::TensorMap* map, uint32_t bar, int row,
                                       int head, int b, int arm_tiles = 1) const {
    if (arm_tiles > 0) mbar_arrive_expect_tx(bar, arm_tiles * kTileBytes);
    for (int r = 0; r < kRegions; ++r)
      tma_load_4d(tile(dst) + r * kRegionBytes, map, bar, 64 * r, row, head, b);
  }

  // The block's start: thread 0 initializes the barriers and runs `start` (the descriptors'
  // prefetches, then the query-side loads), then the whole block meets. The query-side tiles
  // (tile 0 onward, on the query barrier) depend on nothing but the block's index, so they are
  // issued before anything is read from the schedule: their DRAM latency runs under the list's
  // dependent reads instead of after them.
  template <typename Start>
  __device__ __forceinline__ void setup(Start&& start) const {
    if (threadIdx.x == 0) {
      init_barriers();
      start();
    }
    __syncthreads();
  }

  // Thread 0: when the schedule lists a key tile (its first key key0 >= 0), its K and V into the
  // last two tiles.
  __device__ __forceinline__ void load_first_keys(const kern::TensorMap* k, const kern::TensorMap* v,
                                                  const CompactBlock& at, int key0) const {
    if (threadIdx.x == 0 && key0 >= 0) {
      load(kTiles - 2, k, bar_k(), key0, at.hk, at.b);
      load(kTiles - 1, v, bar_v(), key0, at.hk, at.b);
    }
  }
};

}  // namespace fva::dev::sm90
