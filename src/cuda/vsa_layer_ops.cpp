// The whole VSA layer on the CUDA backend (SPEC section 3b), executing vsa_layer_plan.h's plan with
// the kernels of kernels/vsa_layer/ and the fine branch's VSA kernels (vsa_ops.cpp):
//   forward:  block means of q and k -> coarse attention, softmax and selection (one launch), and
//             beside it the block means of v -> the coarse output out_c = attn·v_c -> the fine
//             VSA forward over the selected lists, into the reserve -> out =
//             out_c * gate + out_s, which also writes the reserve's record (in the sm_90a
//             forward's epilogue, kern::Sm90FusedLayerGate; after the portable forward, a pass
//             of its own);
//   backward: the fine backward's k2q inverse, and beside it dgate, dout_c and the fine
//             backward's Delta (one pass over dout) -> the coarse backward's q side, then its kv
//             side, which leave the block means' terms -> the fine VSA backward's dK/dV and dQ,
//             which write dq, dk and dv with each block's term added (kern::BlockTerms: no pass
//             of its own).
// Each call's kernels, the fine branch's included, form one chain of programmatic launches
// (kernel_images.h); the backward's chain starts with the fine branch's k2q inverse (latency-bound,
// a few blocks), beside whose last kernel the gate pass (DRAM-bound) runs. Not the other way round,
// as the fine backward runs its Delta: the inverse's kernel for short lists takes a whole SM's
// registers, which it finds only before the gate pass's blocks spread over every SM. Nothing is
// read back on the host and nothing synchronizes: the backward's kernels, the fine branch's
// included, check the reserve's record on the device, and where it is not the record of a forward
// of this call's problem they write nothing.
#include <fmt/format.h>

#include <functional>
#include <limits>

#include "cuda_ops.h"
#include "error.h"
#include "kernel_images.h"
#include "kernel_name.h"
#include "params.h"
#include "vsa_layer_plan.h"

namespace fva::cuda {
namespace {

KernelName kernel_name(const char* op, const VsaProblem& f) {
  return KernelName("fva_layer_", op, "_", dtype_suffix(f.dtype), "_d", f.D);
}

// A contiguous descriptor over a region of the reserve or the workspace.
fva_tensor_t contiguous_tensor(void* data, int32_t dtype, std::initializer_list<int64_t> shape) {
  fva_tensor_t t{};
  t.data = data;
  t.dtype = dtype;
  t.rank = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t n : shape) t.shape[i++] = n;
  int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

// The reserve's regions the fine branch reads or writes, as descriptors.
struct FineViews {
  fva_tensor_t q2k_idx, q2k_num, out_s, lse_s;
};
FineViews fine_views(const VsaLayerPlan& plan, const VsaLayerProblem& p, void* reserve) {
  const VsaProblem& f = p.fine;
  const int64_t Sq = f.num_q_blocks * kVsaBlock;
  const VsaLayerReserve& r = plan.reserve;
  return {contiguous_tensor(reserve_pointer<int32_t>(reserve, r.q2k_idx), FVA_DTYPE_I32,
                            {f.B, f.Hq, f.num_q_blocks, p.topk}),
          contiguous_tensor(reserve_pointer<int32_t>(reserve, r.q2k_num), FVA_DTYPE_I32,
                            {f.B, f.Hq, f.num_q_blocks}),
          contiguous_tensor(reserve_pointer<char>(reserve, r.out_s), f.dtype, {f.B, f.Hq, Sq, f.D}),
          contiguous_tensor(reserve_pointer<float>(reserve, r.lse_s), FVA_DTYPE_F32, {f.B, f.Hq, Sq})};
}

kern::Tensor4 optional_tensor4(const fva_tensor_t* t) {
  return t != nullptr ? tensor4(*t) : kern::Tensor4{nullptr, 0, 0, 0};
}

}  // namespace

void require_vsa_layer_support(const VsaLayerProblem& p, int32_t dtype) {
  require_vsa_support(p.fine, dtype);
  const VsaProblem& f = p.fine;
  // Grids: the per-block passes run a block (or a few) per 64-token block of every head.
  const int64_t units = f.B * (f.Hq * f.num_q_blocks + 2 * f.Hkv * f.num_kv_blocks);
  if (units > std::numeric_limits<int32_t>::max())
    fail(FVA_ERR_UNSUPPORTED,
         "q: B * (Hq * num_q_blocks + 2 * Hkv * num_kv_blocks) = {} blocks of 64 tokens is above "
         "the CUDA backend's limit of 2^31 - 1 for the VSA layer",
         units);
}

VsaLayerSizes vsa_layer_sizes(const fva_handle& h, const VsaLayerProblem& p) {
  const VsaLayerPlan plan = plan_vsa_layer(h, p);
  return {plan.workspace_bytes, plan.reserve.bytes};
}

void vsa_layer_forward(const fva_handle& h, const VsaLayerProblem& p, const fva_tensor_t& q,
                       const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t* gate,
                       const fva_tensor_t& q_block_sizes, const fva_tensor_t& kv_block_sizes,
                       const fva_tensor_t& out, const fva_tensor_t* q2k_idx,
                       const fva_tensor_t* q2k_num, void* reserve, void* ws, void* stream) {
  const VsaProblem& f = p.fine;
  const VsaLayerPlan plan = plan_vsa_layer(h, p);
  const VsaLayerReserve& r = plan.reserve;
  const FineViews fine = fine_views(plan, p, reserve);
  const int32_t nq = static_cast<int32_t>(f.num_q_blocks), nkv = static_cast<int32_t>(f.num_kv_blocks);
  // The call's kernels, the fine branch's included, chained (kernel_images.h).
  const LaunchChain chain(h.device, h.tuning);
  {
    // 1. Block means of q and k; the reserve's record cleared until the forward is done.
    const fva_tensor_t* xs[3] = {&q, &k, &v};
    const WorkspaceRegion* outs[3] = {&r.q_c, &r.k_c, &r.v_c};
    auto means_job = [&](int j, int64_t first_unit) {
      kern::LayerMeansJob job{};
      const bool is_q = j == 0;
      const fva_tensor_t& sizes = is_q ? q_block_sizes : kv_block_sizes;
      job.x = tensor4(*xs[j]);
      job.out = reserve_pointer<char>(reserve, *outs[j]);
      job.sizes = static_cast<const int32_t*>(sizes.data);
      job.sizes_stride = sizes.strides[0];
      job.H = static_cast<int32_t>(is_q ? f.Hq : f.Hkv);
      job.nblocks = is_q ? nq : nkv;
      job.first_unit = first_unit;
      return job;
    };
    kern::LayerMeansParams mp{};
    mp.job[0] = means_job(0, 0);
    mp.job[1] = means_job(1, f.B * f.Hq * nq);
    mp.num_jobs = 2;
    mp.B = static_cast<int32_t>(f.B);
    mp.units = plan.mean_qk_units;
    mp.record_magic = &reserve_pointer<kern::LayerReserveHeader>(reserve, r.record)->magic;
    Launch l;
    l.grid_x = plan.mean_qk_blocks;
    l.block = 128;
    launch("layer", kernel_name("means", f).c_str(), h.device, l, stream, mp);

    // 2. Coarse attention, softmax, selection (and the caller's copy of the lists).
    kern::LayerCoarseForwardParams cp{};
    cp.q_c = reserve_pointer<char>(reserve, r.q_c);
    cp.k_c = reserve_pointer<char>(reserve, r.k_c);
    cp.v_c = reserve_pointer<char>(reserve, r.v_c);
    cp.attn = reserve_pointer<char>(reserve, r.attn);
    cp.out_c = reserve_pointer<char>(reserve, r.out_c);
    cp.q2k_idx = reserve_pointer<int32_t>(reserve, r.q2k_idx);
    cp.q2k_num = reserve_pointer<int32_t>(reserve, r.q2k_num);
    if (q2k_idx != nullptr && q2k_num != nullptr) {
      cp.user_idx = static_cast<int32_t*>(q2k_idx->data);
      cp.user_idx_stride_b = q2k_idx->strides[0];
      cp.user_idx_stride_h = q2k_idx->strides[1];
      cp.user_idx_stride_qb = q2k_idx->strides[2];
      cp.user_num = static_cast<int32_t*>(q2k_num->data);
      cp.user_num_stride_b = q2k_num->strides[0];
      cp.user_num_stride_h = q2k_num->strides[1];
      cp.user_num_stride_qb = q2k_num->strides[2];
    }
    cp.kv_sizes = static_cast<const int32_t*>(kv_block_sizes.data);
    cp.kv_sizes_stride = kv_block_sizes.strides[0];
    cp.B = static_cast<int32_t>(f.B);
    cp.Hq = static_cast<int32_t>(f.Hq);
    cp.Hkv = static_cast<int32_t>(f.Hkv);
    cp.nq = nq;
    cp.nkv = nkv;
    cp.topk = static_cast<int32_t>(p.topk);
    cp.scale = f.scale;
    cp.rows_in_smem = plan.coarse.rows_in_smem ? 1 : 0;
    cp.stage_rows = plan.coarse.stage_rows;
    Launch coarse;
    coarse.grid_x = plan.coarse_q_tiles;
    coarse.grid_y = static_cast<unsigned>(f.B * f.Hq);
    coarse.block = kern::kLayerCoarseThreads;
    coarse.smem = static_cast<size_t>(plan.coarse.q_side_bytes);
    launch("layer", kernel_name("coarse_fwd", f).c_str(), h.device, coarse, stream, cp);

    // 3. Block means of v, beside the coarse attention, which does not read v_c (DRAM-bound
    // beside latency-bound), then the coarse output out_c = attn·v_c.
    kern::LayerMeansParams vp{};
    vp.job[0] = means_job(2, 0);
    vp.num_jobs = 1;
    vp.B = static_cast<int32_t>(f.B);
    vp.units = plan.mean_v_units;
    vp.record_magic = nullptr;
    l.grid_x = plan.mean_v_blocks;
    launch("layer", kernel_name("means_beside", f).c_str(), h.device, l, stream, vp);
    launch("layer", kernel_name("coarse_out", f).c_str(), h.device, coarse, stream, cp);
  }

  // 4. The fine branch over the selected lists, into the reserve, beside the coarse output, and
  // 5. out and the reserve's record: the sm_90a forward computes them in its epilogue, once the
  // coarse output has completed; after the portable forward the gate pass does.
  VsaLayerProblem recorded = p;
  recorded.gate = gate != nullptr;
  kern::Sm90FusedLayerGate fused{};
  fused.gate = optional_tensor4(gate);
  fused.out = tensor4(out);
  fused.out_c = reserve_pointer<char>(reserve, r.out_c);
  fused.nq = nq;
  fused.record = reserve_pointer<kern::LayerReserveHeader>(reserve, r.record);
  fused.record_value = vsa_layer_record(recorded);
  // The coarse output just before writes out_c and nothing else the forward reads, and lets it
  // launch only once the lists are complete: the forward runs beside it until its epilogue.
  fused.out_c_beside = 1;
  if (vsa_forward(h, f, q, k, v, fine.q2k_idx, fine.q2k_num, kv_block_sizes, fine.out_s, fine.lse_s,
                  workspace_pointer<char>(ws, plan.forward_fine), stream, &fused))
    return;
  {
    kern::LayerGateParams gp{};
    gp.gate = fused.gate;
    gp.out = fused.out;
    gp.out_s = fine.out_s.data;
    gp.out_c = fused.out_c;
    gp.B = static_cast<int32_t>(f.B);
    gp.Hq = static_cast<int32_t>(f.Hq);
    gp.nq = nq;
    gp.units = plan.gate_units;
    gp.record = fused.record;
    gp.record_value = fused.record_value;
    Launch l;
    l.grid_x = plan.gate_blocks;
    l.block = 128;
    launch("layer", kernel_name("gate_fwd", f).c_str(), h.device, l, stream, gp);
  }
}

void vsa_layer_backward(const fva_handle& h, const VsaLayerProblem& p, const fva_tensor_t& q,
                        const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t* gate,
                        const fva_tensor_t& q_block_sizes, const fva_tensor_t& kv_block_sizes,
                        const fva_tensor_t& dout, const void* reserve_in, const fva_tensor_t& dq,
                        const fva_tensor_t& dk, const fva_tensor_t& dv, const fva_tensor_t* dgate,
                        void* ws, void* stream) {
  const VsaProblem& f = p.fine;
  const VsaLayerPlan plan = plan_vsa_layer(h, p);
  const VsaLayerReserve& r = plan.reserve;
  // The kernels only read the reserve; the views are typed for both directions.
  void* reserve = const_cast<void*>(reserve_in);
  const FineViews fine = fine_views(plan, p, reserve);
  const int32_t nq = static_cast<int32_t>(f.num_q_blocks), nkv = static_cast<int32_t>(f.num_kv_blocks);
  VsaLayerProblem expected = p;
  expected.gate = gate != nullptr;
  const kern::LayerReserveCheck check{reserve_pointer<kern::LayerReserveHeader>(reserve, r.record),
                                      vsa_layer_record(expected)};
  void* const dout_c = workspace_pointer<char>(ws, plan.dout_c);
  void* const dmm = workspace_pointer<char>(ws, plan.dmm);
  void* const dq_term = workspace_pointer<char>(ws, plan.dq_term);
  void* const dk_term = workspace_pointer<char>(ws, plan.dk_term);
  void* const dv_term = workspace_pointer<char>(ws, plan.dv_term);
  void* const fine_ws = workspace_pointer<char>(ws, plan.backward_fine);
  // The call's kernels, the fine branch's included, chained (kernel_images.h): the fine backward's
  // k2q inverse, then (its hook, before_gradients) the layer's own kernels, the first of them beside
  // the inverse's last kernel, then the fine kernels that write dq, dk and dv.
  const LaunchChain chain(h.device, h.tuning);
  const std::function<void()> layer_kernels = [&] {
    // 1. dgate, dout_c = the coarse output's gradient, and the fine backward's Delta.
    kern::LayerGateBackwardParams gp{};
    gp.check = check;
    gp.dout = tensor4(dout);
    gp.gate = optional_tensor4(gate);
    gp.dgate = optional_tensor4(gate != nullptr ? dgate : nullptr);
    gp.out_c = reserve_pointer<char>(reserve, r.out_c);
    gp.dout_c = dout_c;
    gp.B = static_cast<int32_t>(f.B);
    gp.Hq = static_cast<int32_t>(f.Hq);
    gp.nq = nq;
    gp.units = plan.gate_units;
    gp.out_s = fine.out_s.data;
    gp.delta = vsa_backward_delta(h, f, fine_ws);
    Launch l;
    l.grid_x = plan.gate_backward_blocks;
    l.block = 128;
    launch("layer", kernel_name("gate_bwd", f).c_str(), h.device, l, stream, gp);

    // 2-3. The coarse attention's backward: its q side, then its kv side.
    kern::LayerCoarseBackwardParams cp{};
    cp.check = check;
    cp.q_c = reserve_pointer<char>(reserve, r.q_c);
    cp.k_c = reserve_pointer<char>(reserve, r.k_c);
    cp.v_c = reserve_pointer<char>(reserve, r.v_c);
    cp.attn = reserve_pointer<char>(reserve, r.attn);
    cp.dout_c = dout_c;
    cp.dmm = dmm;
    cp.dq_term = dq_term;
    cp.dk_term = dk_term;
    cp.dv_term = dv_term;
    cp.q_sizes = static_cast<const int32_t*>(q_block_sizes.data);
    cp.q_sizes_stride = q_block_sizes.strides[0];
    cp.kv_sizes = static_cast<const int32_t*>(kv_block_sizes.data);
    cp.kv_sizes_stride = kv_block_sizes.strides[0];
    cp.B = static_cast<int32_t>(f.B);
    cp.Hq = static_cast<int32_t>(f.Hq);
    cp.Hkv = static_cast<int32_t>(f.Hkv);
    cp.nq = nq;
    cp.nkv = nkv;
    cp.scale = f.scale;
    cp.rows_in_smem = plan.coarse.rows_in_smem ? 1 : 0;
    cp.stage_rows = plan.coarse.stage_rows;
    cp.kv_chunk_rows = plan.coarse.kv_chunk_rows;
    l.grid_x = plan.coarse_q_tiles;
    l.grid_y = static_cast<unsigned>(f.B * f.Hq);
    l.block = kern::kLayerCoarseThreads;
    l.smem = static_cast<size_t>(plan.coarse.q_side_bytes);
    launch("layer", kernel_name("coarse_bwd_q", f).c_str(), h.device, l, stream, cp);
    l.grid_x = plan.coarse_kv_tiles;
    l.grid_y = static_cast<unsigned>(f.B * f.Hkv);
    l.smem = static_cast<size_t>(plan.coarse.kv_side_bytes);
    launch("layer", kernel_name("coarse_bwd_kv", f).c_str(), h.device, l, stream, cp);
  };

  // 4. The fine branch's backward, writing dq, dk, dv with the block means' terms.
  // The first of them runs beside the coarse backward, which writes the terms alone: its q side
  // lets the kv side launch only once the gate pass (Delta) and the inverse before it have
  // completed, and the first of them launches only once every block of the kv side runs
  // (kern::BlockTerms::written_beside).
  const kern::BlockTerms terms{dq_term, dk_term, dv_term, check, /*written_beside=*/1};
  vsa_backward(h, f, q, k, v, fine.out_s, fine.lse_s, dout, fine.q2k_idx, fine.q2k_num,
               kv_block_sizes, dq, dk, dv, fine_ws, stream, &terms, /*delta_written=*/true,
               &layer_kernels);
}

}  // namespace fva::cuda
