// The plan of the whole VSA layer on the CUDA backend (SPEC section 3b): the reserve's layout, the
// workspace both calls share, and the launch shapes, from the handle and the shapes alone (never the
// gate, never index or size contents). fva_vsa_layer_sizes and both calls build the same plan;
// vsa_layer_ops.cpp executes it.
//
// The reserve (what the forward leaves for the backward), each region contiguous, at a multiple of
// 64 bytes from the reserve's own start (not from an aligned base, so a reserve copied to another
// 16-byte aligned address keeps its meaning):
//   record  kern::LayerReserveHeader (shared/vsa_layer_params.h)
//   q_c     [B, Hq, nq, D]        dtype   block means
//   k_c     [B, Hkv, nkv, D]      dtype
//   v_c     [B, Hkv, nkv, D]      dtype
//   attn    [B, Hq, nq, nkv]      dtype   coarse weights (the scores, during the forward)
//   out_c   [B, Hq, nq, D]        dtype   coarse output
//   q2k_idx [B, Hq, nq, topk]     int32   the selection, ascending, -1 past q2k_num
//   q2k_num [B, Hq, nq]           int32
//   out_s   [B, Hq, 64 nq, D]     dtype   the fine branch's output
//   lse_s   [B, Hq, 64 nq]        fp32    and its lse
// The workspace (core/workspace.h: regions from its 64-byte aligned base), the larger of
//   forward:  fine   the fine forward's own workspace (vsa_plan.h), when it needs one
//   backward: fine   the fine backward's own workspace
//             dout_c [B, Hq, nq, D], dmm [B, Hq, nq, nkv]: the coarse branch's gradients, dtype
//             dq_term [B, Hq, nq, D], dk_term, dv_term [B, Hkv, nkv, D]: the block means'
//                  backward, dtype(d(x_c) / size) per block, which the fine backward adds to every
//                  row of the block as it writes dq, dk, dv (kern::BlockTerms), once the reserve's
//                  record has checked out
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/problems.h"
#include "core/vsa_layer_record.h"
#include "core/workspace.h"
#include "handle.h"
#include "shared/layer_coarse_plan.h"
#include "shared/vsa_layer_params.h"

namespace fva::cuda {

struct VsaLayerReserve {
  WorkspaceRegion record, q_c, k_c, v_c, attn, out_c, q2k_idx, q2k_num, out_s, lse_s;
  size_t bytes = 0;
};

struct VsaLayerPlan {
  VsaLayerReserve reserve;
  WorkspaceRegion forward_fine;  // absent while the fine forward needs no workspace
  WorkspaceRegion backward_fine, dout_c, dmm, dq_term, dk_term, dv_term;
  size_t forward_workspace = 0, backward_workspace = 0;
  size_t workspace_bytes = 0;  // the larger: one buffer serves both calls

  // Launch shapes (kernels/vsa_layer/): units of work of the per-block passes and blocks of 128
  // threads for them; the coarse kernels' grids (x: tiles of kLayerCoarseRows rows, y: heads).
  // The block means run in two launches: q's and k's before the coarse attention, v's beside it
  // (v_c is first read by the coarse output, vsa_layer/coarse_forward.cu).
  int64_t mean_qk_units = 0, mean_v_units = 0, gate_units = 0;
  unsigned mean_qk_blocks = 0, mean_v_blocks = 0, gate_blocks = 0, gate_backward_blocks = 0;
  unsigned coarse_q_tiles = 0, coarse_kv_tiles = 0;
  // The coarse kernels' shared memory: tile rows in it or not, the q side's stage and the kv side's
  // chunk, and each side's dynamic bytes (shared/layer_coarse_plan.h).
  kern::LayerCoarseSmemPlan coarse;
};

VsaLayerPlan plan_vsa_layer(const fva_handle& h, const VsaLayerProblem& p);

// Where region r of the reserve lies (offsets from the reserve's own start).
template <typename T>
T* reserve_pointer(void* reserve, const WorkspaceRegion& r) {
  return reinterpret_cast<T*>(static_cast<char*>(reserve) + r.offset);
}

}  // namespace fva::cuda
