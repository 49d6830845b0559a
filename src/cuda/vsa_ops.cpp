// VSA on the CUDA backend: forward (one launch), backward (Delta, the k2q inverse in the workspace,
// dQ and dK/dV; on sm_90a dK/dV storing dS, then dQ from it) and the public k2q inversion. Index
// contents are never read on the host: the kernels apply the metadata rules of
// src/cpu/vsa_common.h themselves.
#include <fmt/format.h>

#include <limits>

#include "cuda_ops.h"
#include "error.h"
#include "kernel_images.h"
#include "params.h"
#include "sm90_kernels.h"

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

kern::AttentionParams attention_params(const cpu::VsaProblem& p, const fva_tensor_t& q,
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
  a.Sq = static_cast<int32_t>(p.num_q_blocks * cpu::kVsaBlock);
  a.Skv = static_cast<int32_t>(p.num_kv_blocks * cpu::kVsaBlock);
  a.scale = p.scale;
  a.scale_log2 = p.scale * 1.4426950408889634f;  // fp32 product, as the CPU reference computes it
  a.vsa = lists(q2k_idx, q2k_num, &block_sizes, p.num_kv_blocks);
  return a;
}

// The inverse's buffers, for `units` = B * H lists of num_q_blocks x max_k entries each.
struct InverseBuffers {
  kern::InvertChunking chunking;
  int32_t *tally, *offsets, *entries;
};
InverseBuffers carve_inverse(int64_t units, int64_t nqb, int64_t nkv, int64_t max_k,
                             WorkspaceCarver& c) {
  InverseBuffers b;
  b.chunking = kern::invert_chunking(nqb, nkv, max_k);
  b.tally = c.take<int32_t>(static_cast<size_t>(std::max<int64_t>(units * nkv * b.chunking.num_chunks, 1)));
  b.offsets = c.take<int32_t>(static_cast<size_t>(units * (nkv + 1)));
  b.entries = c.take<int32_t>(static_cast<size_t>(std::max<int64_t>(units * nqb * max_k, 1)));
  return b;
}

// Launches steps 1-3 of kernels/indices/vsa_invert.cu (and 4 when ip.k2q_idx is set).
void build_inverse(const fva_handle& h, kern::InvertParams& ip, const InverseBuffers& b,
                   void* stream) {
  ip.rows_per_chunk = b.chunking.rows_per_chunk;
  ip.num_chunks = b.chunking.num_chunks;
  ip.tally = b.tally;
  ip.offsets = b.offsets;
  ip.entries = b.entries;
  const int64_t units = static_cast<int64_t>(ip.B) * ip.H;
  const size_t window_bytes =
      sizeof(int32_t) * static_cast<size_t>(std::min(ip.lists.num_kv_blocks, kern::kInvertKvWindow));
  Launch l;
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
  if (ip.k2q_idx != nullptr) {
    l.grid_x = blocks_for(units * ip.lists.num_kv_blocks, 256);
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

void require_vsa_support(const cpu::VsaProblem& p, int32_t dtype) {
  require_attention_kernels(p.D, dtype, p.B * p.Hq);
  if ((p.num_q_blocks + p.num_kv_blocks) * cpu::kVsaBlock > std::numeric_limits<int32_t>::max() - 64)
    fail(FVA_ERR_UNSUPPORTED, "q/k: sequence lengths above 2^31 are not supported by the CUDA backend");
  require_index_size(p.B * p.Hq, p.num_q_blocks, p.max_k);
}

size_t vsa_forward_workspace(const cpu::VsaProblem&) { return 0; }

void vsa_forward(const fva_handle& h, const cpu::VsaProblem& p, const fva_tensor_t& q,
                 const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& q2k_idx,
                 const fva_tensor_t& q2k_num, const fva_tensor_t& block_sizes,
                 const fva_tensor_t& o, const fva_tensor_t& lse, void*, void* stream) {
  ensure_context(h.device);
  const LaunchChain chain(h.device);  // the call's kernels chained (kernel_images.h)
  kern::AttentionParams a = attention_params(p, q, k, v, q2k_idx, q2k_num, block_sizes);
  a.o = tensor4(o);
  a.lse = tensor3(lse);
  kern::Sm90ForwardParams native;
  if (sm90_forward_prepare(h, Sm90Kind::kVsa, a, p.D, false, 0, &native, a.Skv)) {
    sm90_forward_launch(h, Sm90Kind::kVsa, native, p.D, q.dtype, false, stream);
    return;
  }
  Launch l;
  l.grid_x = static_cast<unsigned>(p.num_q_blocks);
  l.grid_y = static_cast<unsigned>(p.B * p.Hq);
  l.block = 64;  // 2 warps x 32 rows (kernels/portable/attention_forward.cuh)
  l.smem = static_cast<size_t>(kern::forward_2warp_smem_bytes(static_cast<int>(p.D)));
  launch("vsa", fmt::format("fva_vsa_fwd_{}_d{}", dtype_suffix(q.dtype), p.D).c_str(), h.device, l,
         stream, a);
}

namespace {

// The stored-dS backward's chunks (sm90_kernels.h): a tile per q head, q block and q2k slot.
Sm90DsChunks ds_chunks(const fva_handle& h, const cpu::VsaProblem& p) {
  return sm90_ds_chunks(h, p.D, p.B * p.Hkv, (p.Hq / p.Hkv) * p.num_q_blocks * p.max_k);
}

// The dK/dV block order's kernel (fva_vsa_invert_order) keeps a unit's block weights in shared
// memory, up to kVsaOrderMaxKvBlocks; past that the blocks run in index order.
bool orders_kv_blocks(const cpu::VsaProblem& p) {
  return p.num_kv_blocks <= kern::kVsaOrderMaxKvBlocks;
}

// Delta's blocks per SM where it runs beside the k2q inverse: 512 of the SM's 2048 threads, so
// the inverse's blocks still find room, and with kDeltaUnroll row groups in flight per warp
// (portable/attention_backward.cuh) enough loads for the DRAM.
constexpr unsigned kDeltaBesideBlocksPerSm = 4;

struct VsaBackwardBuffers {
  float* delta;
  int32_t* delta_done;  // Delta's count of finished blocks, where it runs beside the inverse
  InverseBuffers inverse;
  int32_t* kv_order;  // [B * Hkv, num_kv_blocks], or null (orders_kv_blocks)
  void* ds_tiles;  // the stored-dS backward's tiles (sm90_ds_chunks), else null
};
VsaBackwardBuffers carve_backward(const cpu::VsaProblem& p, const Sm90DsChunks& chunks,
                                  WorkspaceCarver& c) {
  VsaBackwardBuffers b;
  b.delta = c.take<float>(static_cast<size_t>(p.B * p.Hq * p.num_q_blocks * cpu::kVsaBlock));
  b.inverse = carve_inverse(p.B * p.Hq, p.num_q_blocks, p.num_kv_blocks, p.max_k, c);
  b.kv_order = orders_kv_blocks(p)
                   ? c.take<int32_t>(static_cast<size_t>(p.B * p.Hkv * p.num_kv_blocks))
                   : nullptr;
  b.delta_done = b.kv_order != nullptr ? c.take<int32_t>(1) : nullptr;  // the order waits for it
  b.ds_tiles = chunks.kv_units_per_chunk > 0 ? c.take<char>(chunks.bytes) : nullptr;
  return b;
}

}  // namespace

size_t vsa_backward_workspace(const fva_handle& h, const cpu::VsaProblem& p) {
  WorkspaceCarver c(nullptr);
  carve_backward(p, ds_chunks(h, p), c);
  return c.bytes();
}

void vsa_backward(const fva_handle& h, const cpu::VsaProblem& p, const fva_tensor_t& q,
                  const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& o,
                  const fva_tensor_t& lse, const fva_tensor_t& dout, const fva_tensor_t& q2k_idx,
                  const fva_tensor_t& q2k_num, const fva_tensor_t& block_sizes,
                  const fva_tensor_t& dq, const fva_tensor_t& dk, const fva_tensor_t& dv, void* ws,
                  void* stream) {
  ensure_context(h.device);
  const LaunchChain chain(h.device);  // the call's kernels chained (kernel_images.h)
  WorkspaceCarver c(ws);
  const Sm90DsChunks chunks = ds_chunks(h, p);
  const VsaBackwardBuffers buf = carve_backward(p, chunks, c);
  kern::AttentionParams a = attention_params(p, q, k, v, q2k_idx, q2k_num, block_sizes);
  set_backward_tensors(a, o, dout, lse, dq, dk, dv, buf.delta);
  const char* sfx = dtype_suffix(q.dtype);

  kern::InvertParams ip{};
  ip.lists = a.vsa;
  ip.B = a.B;
  ip.H = a.Hq;
  ip.skip_empty_blocks = 1;  // blocks without a real token contribute nothing
  if (buf.delta_done != nullptr) {
    // Delta first, in a grid that stays resident beside the inverse's kernels (DRAM-bound beside
    // latency-bound): the block order, the last of them, holds its exit until Delta's count is
    // full, so the dK/dV kernel chained after it reads a finished Delta (indices/vsa_invert.cu).
    memset_words(buf.delta_done, 0, 1, stream, "Delta's count");
    kern::AttentionParams counted = a;
    counted.delta_done = buf.delta_done;
    ip.delta_done = buf.delta_done;
    ip.delta_blocks = static_cast<int32_t>(launch_delta(
        h, counted, p.D, q.dtype, stream, kDeltaBesideBlocksPerSm * static_cast<unsigned>(h.device.sm_count)));
  }
  build_inverse(h, ip, buf.inverse, stream);
  a.vsa.inv_offsets = buf.inverse.offsets;
  a.vsa.inv_entries = buf.inverse.entries;
  a.vsa.inv_entries_per_unit = p.num_q_blocks * p.max_k;
  if (buf.kv_order != nullptr) {
    // dK/dV's blocks longest list first (fva_vsa_invert_order): the grid's tail is then its
    // shortest blocks.
    ip.kv_order = buf.kv_order;
    ip.group = static_cast<int32_t>(p.Hq / p.Hkv);
    Launch l;
    l.block = 128;  // a thread per kv block, each ranked against all of its unit's
    l.grid_x = static_cast<unsigned>(p.B * p.Hkv) * blocks_for(p.num_kv_blocks, l.block);
    launch("vsa", "fva_vsa_invert_order", h.device, l, stream, ip);
    a.vsa.kv_order = buf.kv_order;
  } else {
    launch_delta(h, a, p.D, q.dtype, stream);  // beside the inverse's last kernel
  }

  // sm_90: the Hopper-native dQ and dK/dV where they cover the call.
  kern::Sm90BackwardParams native;
  if (sm90_backward_prepare(h, a, p.D, &native)) {
    if (chunks.kv_units_per_chunk > 0) {  // dK/dV storing dS, then dQ from it
      sm90_stored_ds_backward_launch(h, Sm90Kind::kVsa, native, p.D, q.dtype, chunks, buf.ds_tiles,
                                     static_cast<int32_t>(p.num_q_blocks),
                                     static_cast<int32_t>(p.max_k), stream);
      return;
    }
    sm90_dq_launch(h, Sm90Kind::kVsa, native, p.D, q.dtype, stream);
    sm90_dkdv_launch(h, Sm90Kind::kVsa, native, p.D, q.dtype, stream);
    return;
  }
  Launch l;
  l.grid_x = static_cast<unsigned>(p.num_q_blocks);
  l.grid_y = static_cast<unsigned>(p.B * p.Hq);
  l.smem = static_cast<size_t>(kern::dq_smem_bytes(static_cast<int>(p.D)));
  launch("vsa", fmt::format("fva_vsa_bwd_dq_{}_d{}", sfx, p.D).c_str(), h.device, l, stream, a);
  l.grid_x = static_cast<unsigned>(p.num_kv_blocks);
  l.grid_y = static_cast<unsigned>(p.B * p.Hkv);
  l.smem = static_cast<size_t>(kern::dkdv_smem_bytes(static_cast<int>(p.D)));
  launch("vsa", fmt::format("fva_vsa_bwd_dkdv_{}_d{}", sfx, p.D).c_str(), h.device, l, stream, a);
}

size_t vsa_invert_indices_workspace(const cpu::VsaIndexProblem& p) {
  WorkspaceCarver c(nullptr);
  carve_inverse(p.B * p.H, p.num_q_blocks, p.num_kv_blocks, p.max_k, c);
  return c.bytes();
}

void vsa_invert_indices(const fva_handle& h, const cpu::VsaIndexProblem& p,
                        const fva_tensor_t& q2k_idx, const fva_tensor_t& q2k_num,
                        const fva_tensor_t& k2q_idx, const fva_tensor_t& k2q_num, void* ws,
                        void* stream) {
  if (p.B * p.H > 65535 * 256)
    fail(FVA_ERR_UNSUPPORTED, "q2k_idx: B * H = {} is above the CUDA backend's limit", p.B * p.H);
  require_index_size(p.B * p.H, p.num_q_blocks, p.max_k);
  ensure_context(h.device);
  const LaunchChain chain(h.device);  // the call's kernels chained (kernel_images.h)
  WorkspaceCarver c(ws);
  const InverseBuffers buf = carve_inverse(p.B * p.H, p.num_q_blocks, p.num_kv_blocks, p.max_k, c);
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
