// The parameter blocks of the whole VSA layer's kernels (kernels/vsa_layer/, SPEC section 3b) and
// the record the forward leaves at the start of the reserve, shared by the CUDA backend
// (src/cuda/vsa_layer_ops.cpp, plain C++) and the kernels (nvcc), so both agree on every layout.
//
// The layer's own buffers (in the reserve or the workspace) are contiguous: [B, H, n, D] for block
// vectors, [B, Hq, nq, nkv] for the coarse weights, [B, Hq, nq, topk] for the lists. The caller's
// tensors come as Tensor4 views (element strides, last dimension contiguous, 16-byte aligned rows).
#pragma once

#include <stdint.h>

#include "shared/host_device.h"
#include "shared/kernel_params.h"  // with shared/layer_reserve_record.h

namespace fva::kern {

// ---- forward ---------------------------------------------------------------------------------------

// Block means of q, k and v in one launch (vsa_layer/block_means.cu): job j averages the real slots
// of every 64-token block of x into out (contiguous [B, H, nblocks, D], the dtype), a unit of
// work per (b, h, block); the jobs' units follow each other from unit 0.
struct LayerMeansJob {
  Tensor4 x;
  void* out;
  const int32_t* sizes;  // [nblocks], clamped to [0, 64] when read
  int64_t sizes_stride;
  int32_t H, nblocks;
  int64_t first_unit;
};
constexpr int kLayerMeansJobs = 3;
struct LayerMeansParams {
  LayerMeansJob job[kLayerMeansJobs];
  int32_t num_jobs;
  int32_t B;
  int64_t units;
  uint32_t* record_magic;  // cleared by block 0: the reserve holds no finished forward
};

// The coarse attention over block means and the selection (vsa_layer/coarse_forward.cu): a block
// of kLayerCoarseThreads per (b, q head, tile of kLayerCoarseRows q blocks), a warp per row.
constexpr int kLayerCoarseRows = 16;
constexpr int kLayerCoarseThreads = 512;
// The coarse kernels keep their tile's [16 x nkv] rows (scores and weights; dattn and dmm) in
// dynamic shared memory up to this many kv blocks, and work on their global home beyond it.
constexpr int kLayerCoarseSmemMaxKv = 1024;
// The elements from one of those rows to the next in shared memory: nkv rounded up to whole k16
// steps, plus 8 (16-byte aligned rows whose 16-byte pieces fall in distinct banks).
FVA_HD constexpr int64_t layer_coarse_row_pitch(int64_t nkv) { return (nkv + 15) / 16 * 16 + 8; }
struct LayerCoarseForwardParams {
  const void* q_c;  // [B, Hq, nq, D]
  const void* k_c;  // [B, Hkv, nkv, D]
  const void* v_c;  // [B, Hkv, nkv, D]
  void* attn;       // [B, Hq, nq, nkv]: first the scores, then softmax(scores)
  void* out_c;      // [B, Hq, nq, D]
  int32_t* q2k_idx;  // [B, Hq, nq, topk], ascending
  int32_t* q2k_num;  // [B, Hq, nq] = topk
  // The caller's copies of the lists (null: not wanted).
  int32_t* user_idx;
  int64_t user_idx_stride_b, user_idx_stride_h, user_idx_stride_qb;
  int32_t* user_num;
  int64_t user_num_stride_b, user_num_stride_h, user_num_stride_qb;
  const int32_t* kv_sizes;  // [nkv]: a kv block of size <= 0 takes no part
  int64_t kv_sizes_stride;
  int32_t B, Hq, Hkv, nq, nkv, topk;
  float scale;
  int32_t rows_in_smem;  // nkv <= kLayerCoarseSmemMaxKv: the tile's rows in dynamic shared memory
  // Rows of k_c or v_c the block's stage holds (dynamic shared memory, a multiple of 128): the
  // products' operands come in chunks of this many rows (vsa_layer/coarse_tiles.cuh).
  int32_t stage_rows;
};

// out = out_c[block] * gate + out_s (gate.data null: out_c[block] + out_s), a unit per (b, q head,
// q block) (vsa_layer/gate.cu).
// The forward's last kernel, so its block 0 writes the reserve's record.
struct LayerGateParams {
  Tensor4 gate;     // data null: no gate
  Tensor4 out;
  const void* out_s;  // [B, Hq, Sq, D]
  const void* out_c;  // [B, Hq, nq, D]
  int32_t B, Hq, nq;
  int64_t units;
  LayerReserveHeader* record;
  LayerReserveHeader record_value;
};

// ---- backward --------------------------------------------------------------------------------------

// dgate = dout * out_c[block] and dout_c[i] = sum over block i's 64 slots of dout * gate (or dout),
// a unit per (b, q head, q block) (vsa_layer/gate.cu).
struct LayerGateBackwardParams {
  LayerReserveCheck check;
  Tensor4 dout;
  Tensor4 gate;   // data null: no gate
  Tensor4 dgate;  // data null exactly when gate's is
  const void* out_c;  // [B, Hq, nq, D]
  void* dout_c;       // [B, Hq, nq, D]
  int32_t B, Hq, nq;
  int64_t units;
  // Not null: the fine backward's Delta (fp32 [B, Hq, nq * 64], its workspace's) from out_s
  // ([B, Hq, nq * 64, D], contiguous, the reserve's) and dout, which the fine backward then takes
  // as written.
  const void* out_s;
  float* delta;
};

// The coarse attention's backward for its q side (vsa_layer/coarse_backward.cu), a block per (b, q
// head, tile of kLayerCoarseRows q blocks): dattn = dout_c v_cᵀ, the softmax's backward, dmm =
// dscores * scale (written over dattn in dmm), dq_c = dmm k_c, written as the block means' terms
// dtype(dq_c / size) that the fine backward adds to dq (kern::BlockTerms).
struct LayerCoarseBackwardParams {
  LayerReserveCheck check;
  const void* q_c;     // [B, Hq, nq, D]
  const void* k_c;     // [B, Hkv, nkv, D]
  const void* v_c;     // [B, Hkv, nkv, D]
  const void* attn;    // [B, Hq, nq, nkv]
  const void* dout_c;  // [B, Hq, nq, D]
  void* dmm;           // [B, Hq, nq, nkv]
  void* dq_term;       // [B, Hq, nq, D]
  // Its kv side, a block per (b, kv head, tile of kLayerCoarseRows kv blocks): dv_c = attnᵀ dout_c
  // and dk_c = dmmᵀ q_c, each summed over the kv head's q heads, written as terms too.
  void* dk_term;  // [B, Hkv, nkv, D]
  void* dv_term;  // [B, Hkv, nkv, D]
  const int32_t* q_sizes;   // [nq]
  int64_t q_sizes_stride;
  const int32_t* kv_sizes;  // [nkv]
  int64_t kv_sizes_stride;
  int32_t B, Hq, Hkv, nq, nkv;
  float scale;
  int32_t rows_in_smem;  // the q side's tile rows in dynamic shared memory (as the forward's)
  int32_t stage_rows;    // the q side's chunks of v_c and k_c (as the forward's)
  int32_t kv_chunk_rows;  // the kv side's chunks of q blocks (a multiple of 16)
};

}  // namespace fva::kern
