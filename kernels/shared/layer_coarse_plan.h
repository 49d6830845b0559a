// The shared memory of the VSA layer's coarse kernels (kernels/vsa_layer/coarse_*.cu, blocks of
// kLayerCoarseThreads, two an SM by their launch bounds), planned on the host from the device's
// shared memory per SM and the shapes alone, and checked without a GPU
// (tests/test_layer_coarse_plan.cpp).
//   - The q side (the forward and the backward's q side): static arrays (the tile's 16 rows at
//     pitch D + 8, the forward's per-warp histograms), then in dynamic shared memory the stage
//     (stage_rows rows of k_c or v_c at pitch D + 8, a multiple of 128) and, up to
//     kLayerCoarseSmemMaxKv kv blocks, the tile's [16 x layer_coarse_row_pitch(nkv)] rows. The
//     stage takes what remains of a block's share of the SM (half of it, less the 1 KiB the driver
//     keeps per block) after the rest, in whole 128-row steps, at least 128 rows, at most every kv
//     block: one chunk where two blocks still fit an SM.
//   - The kv side: a static array (its 16 kv blocks' sizes), then in dynamic shared memory, per q
//     block of its chunk, the rows of dout_c and q_c (pitch D + 8) and the 16-column windows of
//     attn and dmm; the chunk is a multiple of 16, at least 16, at most every q block.
// At the floor (128 stage rows, 16 q blocks) every plan fits the per-block limit of every GPU since
// Ampere (99 KiB on sm_86, sm_89 and sm_120), 1024 kv blocks of tile rows included.
#pragma once

#include <stdint.h>

#include "shared/vsa_layer_params.h"

namespace fva::kern {

constexpr int64_t kLayerCoarseReservedPerBlock = 1024;  // what the driver keeps of each block's
constexpr int64_t kLayerCoarseUnknownSmemPerSm = 100 * 1024;  // a device that does not say: the least

// A staged row of 16-bit elements at pitch D + 8.
FVA_HD constexpr int64_t layer_coarse_row_bytes(int64_t D) { return 2 * (D + 8); }

// The q side's static shared memory: the tile's rows and the forward's histograms (16 warps x 256
// ints), which the coarse forward's arrays take exactly (a static_assert there).
FVA_HD constexpr int64_t layer_coarse_static_bytes(int64_t D) {
  return kLayerCoarseRows * layer_coarse_row_bytes(D) + 4 * 256 * kLayerCoarseRows;
}

// The kv side's static shared memory: its kv blocks' sizes (coarse_backward.cu asserts it). The
// q side's backward needs less static memory than the forward (no histograms), which the plan
// gives both.
FVA_HD constexpr int64_t layer_coarse_kv_static_bytes() { return 4 * kLayerCoarseRows; }

struct LayerCoarseSmemPlan {
  bool rows_in_smem = false;    // the tile's rows in shared memory (nkv <= kLayerCoarseSmemMaxKv)
  int32_t stage_rows = 0;       // LayerCoarseForwardParams::stage_rows
  int64_t q_side_bytes = 0;     // the q side's dynamic shared memory: the stage, then the tile rows
  int32_t kv_chunk_rows = 0;    // LayerCoarseBackwardParams::kv_chunk_rows
  int64_t kv_side_bytes = 0;    // the kv side's dynamic shared memory
};

// What fits of `all`, rounded down to whole steps already, but at least `floor`.
constexpr int64_t layer_coarse_chunk(int64_t fit, int64_t all, int64_t floor) {
  const int64_t chunk = fit < all ? fit : all;
  return chunk > floor ? chunk : floor;
}

// smem_per_sm: the device's shared memory per SM in bytes (0: unknown).
inline LayerCoarseSmemPlan plan_layer_coarse_smem(int64_t smem_per_sm, int64_t D, int64_t nq, int64_t nkv) {
  const int64_t per_sm = smem_per_sm > 0 ? smem_per_sm : kLayerCoarseUnknownSmemPerSm;
  const int64_t per_block = per_sm / 2 - kLayerCoarseReservedPerBlock;
  const int64_t row_bytes = layer_coarse_row_bytes(D);
  LayerCoarseSmemPlan plan;
  plan.rows_in_smem = nkv <= kLayerCoarseSmemMaxKv;
  const int64_t tile_rows = plan.rows_in_smem ? 2 * kLayerCoarseRows * layer_coarse_row_pitch(nkv) : 0;
  const int64_t taken = layer_coarse_static_bytes(D) + tile_rows;
  const int64_t fit = per_block > taken ? (per_block - taken) / row_bytes / 128 * 128 : 0;
  const int64_t all = (nkv + 127) / 128 * 128;
  const int64_t stage = layer_coarse_chunk(fit, all, 128);
  plan.stage_rows = static_cast<int32_t>(stage);
  plan.q_side_bytes = stage * row_bytes + tile_rows;
  const int64_t q_row_bytes = 2 * row_bytes + 2 * 2 * kLayerCoarseRows;
  const int64_t chunk_fit = (per_block - layer_coarse_kv_static_bytes()) / q_row_bytes / 16 * 16;
  const int64_t chunk_all = (nq + 15) / 16 * 16;
  const int64_t chunk = layer_coarse_chunk(chunk_fit, chunk_all, 16);
  plan.kv_chunk_rows = static_cast<int32_t>(chunk);
  plan.kv_side_bytes = chunk * q_row_bytes;
  return plan;
}

}  // namespace fva::kern
