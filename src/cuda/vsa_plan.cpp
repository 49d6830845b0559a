#include "vsa_plan.h"

#include <algorithm>

namespace fva::cuda {
namespace {

VsaInverseRegions add_inverse(int64_t units, int64_t nqb, int64_t nkv, int64_t max_k,
                              WorkspaceLayout& layout) {
  VsaInverseRegions r;
  r.chunking = kern::invert_chunking(nqb, nkv, max_k);
  r.tally = layout.add<int32_t>(
      static_cast<size_t>(std::max<int64_t>(units * nkv * r.chunking.num_chunks, 1)));
  r.offsets = layout.add<int32_t>(static_cast<size_t>(units * (nkv + 1)));
  r.entries = layout.add<int32_t>(static_cast<size_t>(std::max<int64_t>(units * nqb * max_k, 1)));
  return r;
}

}  // namespace

VsaForwardPlan plan_vsa_forward(const fva_handle& h, const VsaProblem& p) {
  VsaForwardPlan plan;
  if (sm90_available(h, p.D)) plan.family = KernelFamily::kSm90;
  return plan;
}

VsaBackwardPlan plan_vsa_backward(const fva_handle& h, const VsaProblem& p) {
  VsaBackwardPlan plan;
  if (sm90_available(h, p.D)) {
    plan.family = KernelFamily::kSm90;
    // A stored dS tile per q head, q block and q2k slot.
    plan.ds_chunks = sm90_ds_chunks(h.tuning.ds_budget_bytes(), p.B * p.Hkv,
                                    (p.Hq / p.Hkv) * p.num_q_blocks * p.max_k);
  }
  plan.orders_kv_blocks = p.num_kv_blocks <= kern::kVsaOrderMaxKvBlocks;
  plan.dkdv_units_first = kern::vsa_dkdv_units_first(p.B, p.Hq, p.num_q_blocks, p.D,
                                                     p.num_kv_blocks, h.device.l2_bytes);
  WorkspaceLayout layout;
  plan.delta = layout.add<float>(static_cast<size_t>(p.B * p.Hq * p.num_q_blocks * kVsaBlock));
  plan.inverse = add_inverse(p.B * p.Hq, p.num_q_blocks, p.num_kv_blocks, p.max_k, layout);
  if (plan.orders_kv_blocks) {
    plan.kv_order = layout.add<int32_t>(static_cast<size_t>(p.B * p.Hkv * p.num_kv_blocks));
    plan.delta_done = layout.add<int32_t>(1);  // the order waits for Delta's count
  }
  if (plan.ds_chunks.kv_units_per_chunk > 0) plan.ds_tiles = layout.add<char>(plan.ds_chunks.bytes);
  plan.workspace_bytes = layout.bytes();
  return plan;
}

VsaInvertPlan plan_vsa_invert(const VsaIndexProblem& p) {
  VsaInvertPlan plan;
  WorkspaceLayout layout;
  plan.inverse = add_inverse(p.B * p.H, p.num_q_blocks, p.num_kv_blocks, p.max_k, layout);
  plan.workspace_bytes = layout.bytes();
  return plan;
}

}  // namespace fva::cuda
