// VSA on the CUDA backend: forward (one launch), backward (Delta, the k2q inverse in the workspace,
// dQ and dK/dV; on sm_90a dK/dV storing dS, then dQ from it) and the public k2q inversion. Index
// contents are never read on the host: the kernels apply the metadata rules of
// src/cpu/vsa_common.h themselves.
#include <fmt/format.h>

#include <limits>
#include <utility>

#include "cuda_ops.h"
#include "error.h"
#include "kernel_images.h"
#include "kernel_name.h"
#include "params.h"
#include "sm90_kernels.h"
#include "vsa_plan.h"

namespace fva::cuda {
namespace {

kern::VsaLists lists(const fva_tensor_t& q2k_idx, const fva_tensor_t& q2k_num,
                     const fva_tensor_t* block_sizes, int64_t num_kv_blocks) {
  kern::VsaLists l{};
  l.q2k_idx = static_cast<const int32_t*>(q2k_idx.data);
  l.idx_stride_b = q2k_idx.strides[0];
  l.idx_stride_h = q2k_idx.strides[1];
  l.idx_stride_qb = q2k_idx.strides[2];
  l.q2k_num = static_cast<const int32_t*>(q2k_num.data);
  l.num_stride_b = q2k_num.strides[0];
  l.num_stride_h = q2k_num.strides[1];
  l.num_stride_qb = q2k_num.strides[2];
  if (block_sizes) {
    l.block_sizes = static_cast<const int32_t*>(block_sizes->data);
    l.block_sizes_stride = block_sizes->strides[0];
  }
  l.num_q_blocks = static_cast<int32_t>(q2k_idx.shape[2]);
  l.num_kv_blocks = static_cast<int32_t>(num_kv_blocks);
  l.max_k = static_cast<int32_t>(q2k_idx.shape[3]);
  while ((int64_t{1} << l.slot_bits) < l.max_k) ++l.slot_bits;  // the inverse's entry encoding
  return l;
}

kern::AttentionParams attention_params(const VsaProblem& p, const fva_tensor_t& q,
                                       const fva_tensor_t& k, const fva_tensor_t& v,
                                       const fva_tensor_t& q2k_idx, const fva_tensor_t& q2k_num,
                                       const fva_tensor_t& block_sizes) {
  kern::AttentionParams a{};
  a.q = tensor4(q);
  a.k = tensor4(k);
  a.v = tensor4(v);
  a.B = static_cast<int32_t>(p.B);
  a.Hq = static_cast<int32_t>(p.Hq);
  a.Hkv = static_cast<int32_t>(p.Hkv);
  a.Sq = static_cast<int32_t>(p.num_q_blocks * kVsaBlock);
  a.Skv = static_cast<int32_t>(p.num_kv_blocks * kVsaBlock);
  a.scale = p.scale;
  a.scale_log2 = p.scale * 1.4426950408889634f;  // fp32 product, as the CPU reference computes it
  a.vsa = lists(q2k_idx, q2k_num, &block_sizes, p.num_kv_blocks);
  return a;
}

// The inverse's buffers in the caller's workspace.
struct InverseBuffers {
  kern::InvertChunking chunking;
  int32_t *tally, *offsets, *entries;
};
InverseBuffers inverse_buffers(const VsaInverseRegions& r, void* ws) {
  return {r.chunking, workspace_pointer<int32_t>(ws, r.tally),
          workspace_pointer<int32_t>(ws, r.offsets), workspace_pointer<int32_t>(ws, r.entries)};
}

// Launches the k2q inverse (kernels/indices/vsa_invert.cu): fva_vsa_invert_unit where the lists
// are short (kern::invert_in_one_block), else its steps 1-3 and, when ip.kv_order is set, the
// dK/dV block order; then step 4 when ip.k2q_idx is set.
void build_inverse(const fva_handle& h, kern::InvertParams& ip, const InverseBuffers& b,
                   void* stream) {
  ip.rows_per_chunk = b.chunking.rows_per_chunk;
  ip.num_chunks = b.chunking.num_chunks;
  ip.tally = b.tally;
  ip.offsets = b.offsets;
  ip.entries = b.entries;
  const int64_t units = static_cast<int64_t>(ip.B) * ip.H;
  const int64_t group = ip.kv_order != nullptr ? ip.group : 1;
  const int64_t nkv = ip.lists.num_kv_blocks, nqb = ip.lists.num_q_blocks, max_k = ip.lists.max_k;
  Launch l;
  if (kern::invert_in_one_block(group, nqb, nkv, max_k)) {
    l.grid_x = static_cast<unsigned>(units / group);  // a block per (b, kv head)
    l.block = kern::kInvertUnitThreads;
    l.smem = static_cast<size_t>(kern::invert_unit_smem_bytes(nkv, nqb, max_k));
    launch("vsa", "fva_vsa_invert_unit", h.device, l, stream, ip);
  } else {
    const size_t window_bytes =
        sizeof(int32_t) * static_cast<size_t>(std::min<int64_t>(nkv, kern::kInvertKvWindow));
    l.grid_x = static_cast<unsigned>(units * ip.num_chunks);  // a block per (unit, chunk)
    l.block = kern::kInvertThreads;
    l.smem = window_bytes;  // the counters
    launch("vsa", "fva_vsa_invert_tally", h.device, l, stream, ip);
    l.grid_x = static_cast<unsigned>(units);  // a block per unit
    l.block = 1024;
    l.smem = 0;
    launch("vsa", "fva_vsa_invert_scan", h.device, l, stream, ip);
    l.grid_x = static_cast<unsigned>(units * ip.num_chunks);  // a block per (unit, chunk)
    l.block = kern::kInvertThreads;
    l.smem = 3 * window_bytes + sizeof(int32_t) * kern::kInvertPlaceBatch;  // counts, bases, cursors, buckets
    launch("vsa", "fva_vsa_invert_place", h.device, l, stream, ip);
    if (ip.kv_order != nullptr) {
      l.block = 128;  // a thread per kv block, each ranked against all of its unit's
      l.grid_x = static_cast<unsigned>(units / group) * blocks_for(nkv, l.block);
      l.smem = 0;
      launch("vsa", "fva_vsa_invert_order", h.device, l, stream, ip);
    }
  }
  if (ip.k2q_idx != nullptr) {
    l.grid_x = blocks_for(units * nkv, 256);
    l.block = 256;
    l.smem = 0;
    launch("vsa", "fva_vsa_invert_emit", h.device, l, stream, ip);
  }
}

void require_index_size(int64_t units, int64_t nqb, int64_t max_k) {
  if (units * nqb * max_k > std::numeric_limits<int32_t>::max() / 2)
    fail(FVA_ERR_UNSUPPORTED,
         "q2k_idx: B * H * num_q_blocks * max_k = {} is above the CUDA backend's limit of 2^30 list "
         "entries",
         units * nqb * max_k);
}

}  // namespace

void require_vsa_support(const VsaProblem& p, int32_t dtype) {
  require_attention_kernels(p.D, dtype, p.B * p.Hq);
  if ((p.num_q_blocks + p.num_kv_blocks) * kVsaBlock > std::numeric_limits<int32_t>::max() - 64)
    fail(FVA_ERR_UNSUPPORTED, "q/k: sequence lengths above 2^31 are not supported by the CUDA backend");
  require_index_size(p.B * p.Hq, p.num_q_blocks, p.max_k);
}

size_t vsa_forward_workspace(const fva_handle& h, const VsaProblem& p) {
  return plan_vsa_forward(h, p).workspace_bytes;
}

bool vsa_forward(const fva_handle& h, const VsaProblem& p, const fva_tensor_t& q,
                 const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& q2k_idx,
                 const fva_tensor_t& q2k_num, const fva_tensor_t& block_sizes,
                 const fva_tensor_t& o, const fva_tensor_t& lse, void*, void* stream,
                 const kern::Sm90FusedLayerGate* layer_gate) {
  const VsaForwardPlan plan = plan_vsa_forward(h, p);
  const LaunchChain chain(h.device, h.tuning);  // the call's kernels chained (kernel_images.h)
  kern::AttentionParams a = attention_params(p, q, k, v, q2k_idx, q2k_num, block_sizes);
  a.o = tensor4(o);
  a.lse = tensor3(lse);
  kern::Sm90ForwardParams native;
  if (plan.family == KernelFamily::kSm90 &&
      sm90_encode_forward(Sm90Kind::kVsa, a, p.D, a.Skv, &native)) {
    // The layer's output pass, fused where its tensors have maps; otherwise the forward runs as
    // the plain one (it waits at entry) and the layer runs its own pass after it.
    bool fused = false;
    if (layer_gate != nullptr) {
      native.layer_gate = *layer_gate;
      fused = sm90_encode_layer_gate(a, p.D, &native.layer_gate);
      if (!fused) native.layer_gate = {};
    }
    sm90_vsa_forward_launch(h, native, p.D, q.dtype, stream);
    return fused;
  }
  Launch l;
  l.grid_x = static_cast<unsigned>(p.num_q_blocks);
  l.grid_y = static_cast<unsigned>(p.B * p.Hq);
  l.block = 64;  // 2 warps x 32 rows (kernels/portable/attention_forward.cuh)
  l.smem = static_cast<size_t>(kern::forward_2warp_smem_bytes(static_cast<int>(p.D)));
  launch("vsa", KernelName("fva_vsa_fwd_", dtype_suffix(q.dtype), "_d", p.D).c_str(), h.device, l,
         stream, a);
  return false;
}

namespace {

// Delta's blocks per SM where it runs beside the k2q inverse: 512 of the SM's 2048 threads, so
// the inverse's blocks still find room, and with kDeltaUnroll row groups in flight per warp
// (portable/attention_backward.cuh) enough loads for the DRAM.
constexpr unsigned kDeltaBesideBlocksPerSm = 4;

}  // namespace

size_t vsa_backward_workspace(const fva_handle& h, const VsaProblem& p) {
  return plan_vsa_backward(h, p).workspace_bytes;
}

float* vsa_backward_delta(const fva_handle& h, const VsaProblem& p, void* ws) {
  return workspace_pointer<float>(ws, plan_vsa_backward(h, p).delta);
}

void vsa_backward(const fva_handle& h, const VsaProblem& p, const fva_tensor_t& q,
                  const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& o,
                  const fva_tensor_t& lse, const fva_tensor_t& dout, const fva_tensor_t& q2k_idx,
                  const fva_tensor_t& q2k_num, const fva_tensor_t& block_sizes,
                  const fva_tensor_t& dq, const fva_tensor_t& dk, const fva_tensor_t& dv, void* ws,
                  void* stream, const kern::BlockTerms* terms, bool delta_written,
                  const std::function<void()>* before_gradients) {
  const VsaBackwardPlan plan = plan_vsa_backward(h, p);
  const LaunchChain chain(h.device, h.tuning);  // the call's kernels chained (kernel_images.h)
  int32_t* const kv_order = workspace_pointer<int32_t>(ws, plan.kv_order);
  int32_t* const delta_done = workspace_pointer<int32_t>(ws, plan.delta_done);
  kern::AttentionParams a = attention_params(p, q, k, v, q2k_idx, q2k_num, block_sizes);
  set_backward_tensors(a, o, dout, lse, dq, dk, dv, workspace_pointer<float>(ws, plan.delta));
  if (terms != nullptr) a.terms = *terms;

  kern::InvertParams ip{};
  ip.lists = a.vsa;
  ip.B = a.B;
  ip.H = a.Hq;
  ip.skip_empty_blocks = 1;  // blocks without a real token contribute nothing
  if (plan.orders_kv_blocks) {
    // Delta first, in a grid that stays resident beside the inverse's kernels (DRAM-bound beside
    // latency-bound): the inverse's last kernel (the block order, or fva_vsa_invert_unit, which
    // orders too) holds its exit until Delta's count is full, so the dK/dV kernel chained after
    // it reads a finished Delta (indices/vsa_invert.cu). Written earlier in the chain, Delta
    // needs no count: the inverse's kernels wait for the kernels before them as usual.
    if (!delta_written) {
      memset_words(delta_done, 0, 1, stream, "Delta's count");
      kern::AttentionParams counted = a;
      counted.delta_done = delta_done;
      ip.delta_done = delta_done;
      ip.delta_blocks = static_cast<int32_t>(launch_delta(
          h, counted, p.D, q.dtype, stream, kDeltaBesideBlocksPerSm * static_cast<unsigned>(h.device.sm_count)));
    }
    // dK/dV's blocks longest list first (fva_vsa_invert_order): the grid's tail is then its
    // shortest blocks.
    ip.kv_order = kv_order;
    ip.group = static_cast<int32_t>(p.Hq / p.Hkv);
    a.vsa.kv_order = kv_order;
    a.kv_units_first = plan.dkdv_units_first ? 1 : 0;
  }
  const InverseBuffers inverse = inverse_buffers(plan.inverse, ws);
  build_inverse(h, ip, inverse, stream);
  a.vsa.inv_offsets = inverse.offsets;
  a.vsa.inv_entries = inverse.entries;
  a.vsa.inv_entries_per_unit = p.num_q_blocks * p.max_k;
  if (!plan.orders_kv_blocks && !delta_written)
    launch_delta(h, a, p.D, q.dtype, stream);  // beside the inverse's last kernel
  if (before_gradients != nullptr) (*before_gradients)();

  kern::Sm90BackwardParams native;
  if (plan.family == KernelFamily::kSm90 && sm90_encode_backward(a, p.D, &native)) {
    if (plan.ds_chunks.kv_units_per_chunk > 0) {  // dK/dV storing dS, then dQ from it
      sm90_stored_ds_backward_launch(h, Sm90Kind::kVsa, native, p.D, q.dtype, plan.ds_chunks,
                                     workspace_pointer<char>(ws, plan.ds_tiles),
                                     static_cast<int32_t>(p.num_q_blocks),
                                     static_cast<int32_t>(p.max_k), stream);
      return;
    }
    sm90_dq_launch(h, Sm90Kind::kVsa, native, p.D, q.dtype, stream);
    native.a.terms.written_beside = 0;  // only the first gradient kernel runs beside
    sm90_dkdv_launch(h, Sm90Kind::kVsa, native, p.D, q.dtype, stream);
    return;
  }
  const char* sfx = dtype_suffix(q.dtype);
  Launch l;
  l.grid_x = static_cast<unsigned>(p.num_q_blocks);
  l.grid_y = static_cast<unsigned>(p.B * p.Hq);
  l.smem = static_cast<size_t>(kern::dq_smem_bytes(static_cast<int>(p.D)));
  launch("vsa", KernelName("fva_vsa_bwd_dq_", sfx, "_d", p.D).c_str(), h.device, l, stream, a);
  l.grid_x = static_cast<unsigned>(p.num_kv_blocks);
  l.grid_y = static_cast<unsigned>(p.B * p.Hkv);
  if (a.kv_units_first) std::swap(l.grid_x, l.grid_y);  // schedules/dkdv_grid.cuh
  l.smem = static_cast<size_t>(kern::dkdv_smem_bytes(static_cast<int>(p.D)));
  launch("vsa", KernelName("fva_vsa_bwd_dkdv_", sfx, "_d", p.D).c_str(), h.device, l, stream, a);
}

size_t vsa_invert_indices_workspace(const VsaIndexProblem& p) {
  return plan_vsa_invert(p).workspace_bytes;
}

void vsa_invert_indices(const fva_handle& h, const VsaIndexProblem& p,
                        const fva_tensor_t& q2k_idx, const fva_tensor_t& q2k_num,
                        const fva_tensor_t& k2q_idx, const fva_tensor_t& k2q_num, void* ws,
                        void* stream) {
  if (p.B * p.H > 65535 * 256)
    fail(FVA_ERR_UNSUPPORTED, "q2k_idx: B * H = {} is above the CUDA backend's limit", p.B * p.H);
  require_index_size(p.B * p.H, p.num_q_blocks, p.max_k);
  const VsaInvertPlan plan = plan_vsa_invert(p);
  const LaunchChain chain(h.device, h.tuning);  // the call's kernels chained (kernel_images.h)
  const InverseBuffers buf = inverse_buffers(plan.inverse, ws);
  kern::InvertParams ip{};
  ip.lists = lists(q2k_idx, q2k_num, nullptr, p.num_kv_blocks);
  ip.B = static_cast<int32_t>(p.B);
  ip.H = static_cast<int32_t>(p.H);
  ip.skip_empty_blocks = 0;
  ip.k2q_idx = static_cast<int32_t*>(k2q_idx.data);
  ip.k2q_stride_b = k2q_idx.strides[0];
  ip.k2q_stride_h = k2q_idx.strides[1];
  ip.k2q_stride_kv = k2q_idx.strides[2];
  ip.k2q_num = static_cast<int32_t*>(k2q_num.data);
  ip.k2q_num_stride_b = k2q_num.strides[0];
  ip.k2q_num_stride_h = k2q_num.strides[1];
  ip.k2q_num_stride_kv = k2q_num.strides[2];
  build_inverse(h, ip, buf, stream);
}

}  // namespace fva::cuda
