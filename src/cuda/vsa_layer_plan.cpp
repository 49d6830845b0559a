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

// The coarse kernels' shared memory (kernels/vsa_layer/coarse_*.cu, 512 threads, two blocks an SM
// by their launch bounds). What a block may take for two to fit on an SM: half the SM's, less the
// 1 KiB the driver keeps per block (on a device that does not say, 100 KiB an SM, the smallest of
// the GPUs since Ampere). The q side's static arrays are the tile's rows and the forward's
// histograms; its stage takes what remains after them and the tile rows, in whole 128-row steps,
// at least 128 rows (which with the largest tile rows, 1024 kv blocks, still fits the per-block
// limit of every GPU since Ampere, 99 KiB), at most every kv block; the tile rows' pitch is
// kern::layer_coarse_row_pitch. The kv side's chunk takes the rows of dout_c and q_c and the two
// 16-column windows per q block, in whole 16-row steps.
void plan_coarse_smem(const DeviceInfo& device, const VsaProblem& f, VsaLayerPlan* plan) {
  constexpr size_t kReservedPerBlock = 1024, kUnknownSmPerSm = 100 * 1024;
  const size_t per_sm = device.smem_per_sm > 0 ? static_cast<size_t>(device.smem_per_sm) : kUnknownSmPerSm;
  const size_t per_block = per_sm / 2 - kReservedPerBlock;
  const size_t D = static_cast<size_t>(f.D), rows = kern::kLayerCoarseRows;
  const size_t row_bytes = 2 * (D + 8);  // a staged row
  const size_t static_bytes = rows * row_bytes + sizeof(int) * 256 * rows;
  const size_t tile_rows =
      plan->coarse_rows_in_smem ? 2 * rows * static_cast<size_t>(kern::layer_coarse_row_pitch(f.num_kv_blocks)) : 0;
  const size_t taken = static_bytes + tile_rows;
  const size_t fit = per_block > taken ? (per_block - taken) / row_bytes / 128 * 128 : 0;
  const size_t all = (static_cast<size_t>(f.num_kv_blocks) + 127) / 128 * 128;
  const size_t stage = std::max<size_t>(128, std::min(fit, all));
  plan->coarse_stage_rows = static_cast<int>(stage);
  plan->coarse_smem = stage * row_bytes + tile_rows;
  const size_t q_row_bytes = 2 * row_bytes + 2 * 2 * rows;
  const size_t chunk_fit = per_block / q_row_bytes / 16 * 16;
  const size_t chunk_all = (static_cast<size_t>(f.num_q_blocks) + 15) / 16 * 16;
  const size_t chunk = std::max<size_t>(16, std::min(chunk_fit, chunk_all));
  plan->coarse_kv_chunk_rows = static_cast<int>(chunk);
  plan->coarse_kv_smem = chunk * q_row_bytes;
}

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
  plan.mean_units = f.B * (f.Hq * f.num_q_blocks + 2 * f.Hkv * f.num_kv_blocks);
  plan.gate_units = f.B * f.Hq * f.num_q_blocks;
  plan.mean_blocks = blocks_for(plan.mean_units, per_block);
  plan.gate_blocks = static_cast<unsigned>(plan.gate_units);
  plan.gate_backward_blocks = blocks_for(plan.gate_units, per_block);
  plan.coarse_q_tiles = blocks_for(f.num_q_blocks, kern::kLayerCoarseRows);
  plan.coarse_kv_tiles = blocks_for(f.num_kv_blocks, kern::kLayerCoarseRows);
  plan.coarse_rows_in_smem = f.num_kv_blocks <= kern::kLayerCoarseSmemMaxKv;
  plan_coarse_smem(h.device, f, &plan);
  return plan;
}


}  // namespace fva::cuda
