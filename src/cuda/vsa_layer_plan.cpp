#include "vsa_layer_plan.h"

#include <algorithm>
#include <cstring>

#include "cuda_ops.h"
#include "params.h"

namespace fva::cuda {
namespace {

// Threads of the per-block passes' blocks (kernels/vsa_layer/block_means.cu, gate.cu) and the
// units one block holds: a unit of D / 8 threads (eight columns each) for the means and the gate's
// backward, a block per unit for the gate's forward.
constexpr int64_t kPassThreads = 128;
int64_t column_units_per_block(int64_t D) { return kPassThreads / (D / 8); }

}  // namespace

VsaLayerPlan plan_vsa_layer(const fva_handle& h, const VsaLayerProblem& p) {
  const VsaProblem& f = p.fine;
  const size_t es = 2;  // bf16 / f16
  const size_t B = static_cast<size_t>(f.B), Hq = static_cast<size_t>(f.Hq),
               Hkv = static_cast<size_t>(f.Hkv), nq = static_cast<size_t>(f.num_q_blocks),
               nkv = static_cast<size_t>(f.num_kv_blocks), D = static_cast<size_t>(f.D),
               topk = static_cast<size_t>(p.topk);
  const size_t Sq = nq * static_cast<size_t>(kVsaBlock);
  VsaLayerPlan plan;

  WorkspaceLayout r;
  VsaLayerReserve& res = plan.reserve;
  res.record = r.add<kern::LayerReserveHeader>(1);
  res.q_c = r.add<char>(es * B * Hq * nq * D);
  res.k_c = r.add<char>(es * B * Hkv * nkv * D);
  res.v_c = r.add<char>(es * B * Hkv * nkv * D);
  res.attn = r.add<char>(es * B * Hq * nq * nkv);
  res.out_c = r.add<char>(es * B * Hq * nq * D);
  res.q2k_idx = r.add<int32_t>(B * Hq * nq * topk);
  res.q2k_num = r.add<int32_t>(B * Hq * nq);
  res.out_s = r.add<char>(es * B * Hq * Sq * D);
  res.lse_s = r.add<float>(B * Hq * Sq);
  res.bytes = r.bytes() - kWorkspaceBasePad;  // from the reserve's start: no alignment pad

  WorkspaceLayout fw;
  const size_t fine_forward = vsa_forward_workspace(h, f);
  if (fine_forward > 0) plan.forward_fine = fw.add<char>(fine_forward);
  plan.forward_workspace = fw.bytes();

  WorkspaceLayout bw;
  // Its own layout aligns from its start, which a region's 64-byte boundary keeps.
  plan.backward_fine = bw.add<char>(vsa_backward_workspace(h, f));
  plan.dout_c = bw.add<char>(es * B * Hq * nq * D);
  plan.dmm = bw.add<char>(es * B * Hq * nq * nkv);
  plan.dq_term = bw.add<char>(es * B * Hq * nq * D);
  plan.dk_term = bw.add<char>(es * B * Hkv * nkv * D);
  plan.dv_term = bw.add<char>(es * B * Hkv * nkv * D);
  plan.backward_workspace = bw.bytes();
  plan.workspace_bytes = std::max(plan.forward_workspace, plan.backward_workspace);

  const int64_t per_block = column_units_per_block(f.D);
  plan.mean_qk_units = f.B * (f.Hq * f.num_q_blocks + f.Hkv * f.num_kv_blocks);
  plan.mean_v_units = f.B * f.Hkv * f.num_kv_blocks;
  plan.gate_units = f.B * f.Hq * f.num_q_blocks;
  plan.mean_qk_blocks = blocks_for(plan.mean_qk_units, per_block);
  plan.mean_v_blocks = blocks_for(plan.mean_v_units, per_block);
  plan.gate_blocks = static_cast<unsigned>(plan.gate_units);
  plan.gate_backward_blocks = blocks_for(plan.gate_units, per_block);
  plan.coarse_q_tiles = blocks_for(f.num_q_blocks, kern::kLayerCoarseRows);
  plan.coarse_kv_tiles = blocks_for(f.num_kv_blocks, kern::kLayerCoarseRows);
  plan.coarse =
      kern::plan_layer_coarse_smem(h.device.smem_per_sm, f.D, f.num_q_blocks, f.num_kv_blocks);
  return plan;
}

}  // namespace fva::cuda
