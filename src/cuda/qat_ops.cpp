// QAT attention and NVFP4 fake quantization on the CUDA backend. A call is a short sequence of
// launches on the caller's stream:
//   [k mean (smooth_k): partial sums, final]  [NVFP4 fake quantization of q, k, v into the workspace]
//   forward: attention kernel (sm_90: the native one where the plan says)
//   |  backward: Delta, dQ kernel, dK/dV kernel (sm_90: the native ones where the plan says).
// The plan (qat_plan.h) decides which; this file only launches it.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "cuda_ops.h"
#include "error.h"
#include "kernel_images.h"
#include "kernel_name.h"
#include "params.h"
#include "qat_plan.h"
#include "sm90_kernels.h"

namespace fva::cuda {
namespace {

constexpr int kQatTileTokens = 32;   // the CPU reference's (and FastVideo's) Q/K/V tile

// The prepared copies of a plan, in the caller's workspace.
struct PreparedBuffers {
  void* fq = nullptr;
  void* fk = nullptr;
  void* fv = nullptr;
  float* k_mean = nullptr;
  double* mean_partial = nullptr;
};
PreparedBuffers prepared_buffers(const QatPreparedRegions& r, void* ws) {
  return {workspace_pointer<uint16_t>(ws, r.fq), workspace_pointer<uint16_t>(ws, r.fk),
          workspace_pointer<uint16_t>(ws, r.fv), workspace_pointer<float>(ws, r.k_mean),
          workspace_pointer<double>(ws, r.mean_partial)};
}

// One tensor of a quantization launch: x [B, H, S, D] into y.
struct QuantizeTensor {
  kern::Tensor4 x, y;
  int64_t H, S;
  bool quantize;
  const float* mean;
  bool owned_order = false;  // y in the Hopper forward's key order, padded (QuantizeJob)
};

// One launch over up to kern::kMaxQuantizeJobs tensors sharing B, D and the scale mode. tile_tokens
// is tile mode's tile; block mode, which has none, takes its own work unit.
void launch_quantize(const fva_handle& h, int32_t dtype, const std::vector<QuantizeTensor>& jobs,
                     int64_t B, int64_t D, int32_t scale_mode, int32_t tile_tokens, void* stream) {
  if (jobs.empty()) return;
  if (jobs.size() > static_cast<size_t>(kern::kMaxQuantizeJobs))
    fail(FVA_ERR_INTERNAL, "NVFP4 quantization: {} tensors in one launch (at most {})", jobs.size(),
         kern::kMaxQuantizeJobs);
  // The kernel moves 16-element groups with 16-byte accesses: check_attention_tensor's alignment
  // (data, and the strides of dimensions longer than 1, multiples of 16 bytes) guarantees it, and
  // the workspace copies are contiguous; a caller that broke this would fault on the device.
  // Block mode has no tile: its work unit is one batch of groups per warp (kern::kQuantizeBlockBatch),
  // run by the block-mode kernel.
  const bool block_mode = scale_mode == FVA_SCALE_BLOCK;
  if (block_mode) tile_tokens = kern::quantize_block_unit_tokens(D);
  kern::QuantizeParams q{};
  q.num_jobs = static_cast<int32_t>(jobs.size());
  q.B = static_cast<int32_t>(B);
  q.D = static_cast<int32_t>(D);
  q.tile_tokens = tile_tokens;
  q.scale_mode = scale_mode;
  int64_t tiles = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const QuantizeTensor& t = jobs[i];
    auto aligned = [&](const kern::Tensor4& x) {
      const int64_t used =
          (B > 1 ? x.stride_b : 0) | (t.H > 1 ? x.stride_h : 0) | (t.S > 1 ? x.stride_s : 0);
      return reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && used % 8 == 0 && D % 16 == 0;
    };
    if (!aligned(t.x) || !aligned(t.y))
      fail(FVA_ERR_INTERNAL, "NVFP4 quantization: a tensor is not 16-byte aligned per group");
    kern::QuantizeJob& j = q.job[i];
    j.x = t.x;
    j.y = t.y;
    j.H = static_cast<int32_t>(t.H);
    j.S = static_cast<int32_t>(t.S);
    j.quantize = t.quantize ? 1 : 0;
    j.owned_order = t.owned_order ? 1 : 0;
    j.mean = t.mean;
    j.first_tile = tiles;
    tiles += B * t.H * ((t.S + tile_tokens - 1) / tile_tokens);
  }
  q.tiles = tiles;
  constexpr int64_t kWarpsPerBlock = 4;  // a warp per tile
  const int64_t blocks = (tiles + kWarpsPerBlock - 1) / kWarpsPerBlock;
  // (Unreachable on any device's memory: 2^31 blocks are 2^38 tokens.)
  if (blocks > std::numeric_limits<int32_t>::max())
    fail(FVA_ERR_UNSUPPORTED, "NVFP4 quantization: {} tiles of {} tokens are more than one launch holds",
         tiles, tile_tokens);
  Launch l;
  l.grid_x = static_cast<unsigned>(blocks);
  l.block = static_cast<unsigned>(32 * kWarpsPerBlock);
  // Block mode at D = 64 and 128 runs a kernel built for that D (preprocess/nvfp4_quantize.cu).
  const bool fixed_d = block_mode && (D == 64 || D == 128);
  const KernelName name = fixed_d ? KernelName("fva_nvfp4_quantize_", dtype_suffix(dtype), "_d", D)
                                   : KernelName("fva_nvfp4_quantize_", block_mode ? "" : "tile_", dtype_suffix(dtype));
  launch("prep", name.c_str(), h.device, l, stream, q);
}

// The call's parameters, with the prepared copies in place of the inputs they replace.
kern::AttentionParams describe(const QatProblem& p, const QatPreparation& prep,
                               const PreparedBuffers& buf, const fva_tensor_t& q,
                               const fva_tensor_t& k, const fva_tensor_t& v) {
  kern::AttentionParams a{};
  const int64_t kv_rows = prepared_kv_rows(p, prep);
  a.q = prep.q ? contiguous4(buf.fq, p.Hq, p.Sq, p.D) : tensor4(q);
  a.k = prep.k ? contiguous4(buf.fk, p.Hkv, kv_rows, p.D) : tensor4(k);
  a.v = prep.v ? contiguous4(buf.fv, p.Hkv, kv_rows, p.D) : tensor4(v);
  a.k_mean = buf.k_mean;
  a.B = static_cast<int32_t>(p.B);
  a.Hq = static_cast<int32_t>(p.Hq);
  a.Hkv = static_cast<int32_t>(p.Hkv);
  a.Sq = static_cast<int32_t>(p.Sq);
  a.Skv = static_cast<int32_t>(p.Skv);
  a.scale = p.scale;
  // One fp32 value, as the CPU reference rounds it.
  a.scale_log2 = static_cast<float>(static_cast<double>(p.scale) * 1.4426950408889634);
  a.causal = p.cfg.causal;
  a.p_scale = p.cfg.p_scale;
  return a;
}

// Fills the prepared buffers of `a` (describe's): the k mean, then the fake-quantized (or
// smoothed) tensors in one launch; K and V in the Hopper forward's key order where owned_kv_order.
void fill_prepared(const fva_handle& h, const QatProblem& p, const QatPreparation& prep,
                   const PreparedBuffers& buf, const kern::AttentionParams& a,
                   const fva_tensor_t& q, const fva_tensor_t& k, const fva_tensor_t& v,
                   bool owned_kv_order, void* stream) {
  const int32_t dtype = q.dtype;
  const char* sfx = dtype_suffix(dtype);
  if (prep.mean) {
    kern::MeanParams m{};
    m.x = tensor4(k);
    m.B = static_cast<int32_t>(p.B);
    m.H = static_cast<int32_t>(p.Hkv);
    m.S = static_cast<int32_t>(p.Skv);
    m.D = static_cast<int32_t>(p.D);
    m.chunk_tokens = kMeanChunkTokens;
    m.partial = buf.mean_partial;
    m.num_chunks = static_cast<int32_t>(mean_chunks(p));
    m.mean = buf.k_mean;
    Launch l;
    l.grid_x = static_cast<unsigned>(m.num_chunks);
    launch("prep", KernelName("fva_k_mean_partial_", sfx).c_str(), h.device, l, stream, m);
    l.grid_x = 1;
    launch("prep", KernelName("fva_k_mean_final_", sfx).c_str(), h.device, l, stream, m);
  }
  // (The k mean, above, is complete before the quantization: same stream.)
  std::vector<QuantizeTensor> jobs;
  if (prep.q) jobs.push_back({tensor4(q), a.q, p.Hq, p.Sq, true, nullptr});
  if (prep.k)
    jobs.push_back({tensor4(k), a.k, p.Hkv, p.Skv, prep.quantize, buf.k_mean, owned_kv_order});
  if (prep.v) jobs.push_back({tensor4(v), a.v, p.Hkv, p.Skv, true, nullptr, owned_kv_order});
  launch_quantize(h, dtype, jobs, p.B, p.D, p.cfg.qkv_scale, kQatTileTokens, stream);
}

}  // namespace

void require_qat_support(const QatProblem& p, int32_t dtype) {
  require_attention_kernels(p.D, dtype, p.B * p.Hq);
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  if (p.Sq > kMaxInt - 64 || p.Skv > kMaxInt - 64)
    fail(FVA_ERR_UNSUPPORTED, "q/k: sequence lengths above 2^31 - 65 are not supported by the CUDA backend");
}

size_t qat_forward_workspace(const fva_handle& h, const QatProblem& p) {
  return plan_qat_forward(h, p).workspace_bytes;
}

size_t qat_backward_workspace(const fva_handle& h, const QatProblem& p) {
  return plan_qat_backward(h, p).workspace_bytes;
}

void qat_forward(const fva_handle& h, const QatProblem& p, const fva_tensor_t& q,
                 const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& o,
                 const fva_tensor_t* o_hp, const fva_tensor_t& lse, void* ws, void* stream) {
  const QatForwardPlan plan = plan_qat_forward(h, p);
  const LaunchChain chain(h.device, h.tuning);  // the call's kernels chained (kernel_images.h)
  const PreparedBuffers buf = prepared_buffers(plan.prepared, ws);
  kern::AttentionParams a = describe(p, plan.prep, buf, q, k, v);
  a.o = tensor4(o);
  a.o_hp = o_hp ? tensor4(*o_hp) : kern::Tensor4{};
  a.lse = tensor3(lse);
  // The sm_90a forward, when its maps encode: decided before the preparation, since with quantized
  // P it reads K and V in its own key order (key_order.h), which the portable kernel does not, and
  // its maps cover the copies' whole tiles. (The padded copies are exactly the quantized
  // forward's, whose K and V take that order.)
  kern::Sm90ForwardParams native;
  if (plan.family == KernelFamily::kSm90 &&
      sm90_encode_forward(Sm90Kind::kQat, a, p.D, prepared_kv_rows(p, plan.prep), &native)) {
    const Sm90SplitBuffers split{workspace_pointer<float>(ws, plan.split_partials),
                                 workspace_pointer<uint32_t>(ws, plan.split_flags),
                                 workspace_pointer<float>(ws, plan.split_maxima)};
    sm90_forward_split_reset(plan.split, split, stream);
    fill_prepared(h, p, plan.prep, buf, a, q, k, v, plan.prep.padded_kv, stream);
    sm90_qat_forward_launch(h, native, p.D, q.dtype, plan.prep.quantize, plan.split, split,
                            plan.clusters_allowed, stream);
    return;
  }
  fill_prepared(h, p, plan.prep, buf, a, q, k, v, false, stream);
  Launch l;
  l.grid_x = blocks_for(p.Sq, 64);
  l.grid_y = static_cast<unsigned>(p.B * p.Hq);
  l.smem = static_cast<size_t>(kern::forward_smem_bytes(static_cast<int>(p.D)));
  const KernelName name("fva_qat_fwd_", dtype_suffix(q.dtype), "_d", p.D, "_", plan.portable_variant);
  launch("qat", name.c_str(), h.device, l, stream, a);
}

unsigned launch_delta(const fva_handle& h, const kern::AttentionParams& a, int64_t D, int32_t dtype,
                      void* stream, unsigned max_blocks) {
  Launch l;  // 128 threads: 4 warps
  l.grid_x = blocks_for(static_cast<int64_t>(a.B) * a.Hq * a.Sq,
                        4 * kern::delta_rows_per_warp(static_cast<int>(D)));
  if (max_blocks > 0) l.grid_x = std::min(l.grid_x, max_blocks);
  launch("prep", KernelName("fva_delta_", dtype_suffix(dtype), "_d", D).c_str(), h.device, l,
         stream, a);
  return l.grid_x;
}

void qat_backward(const fva_handle& h, const QatProblem& p, const fva_tensor_t& q,
                  const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& o_for_bwd,
                  const fva_tensor_t& lse, const fva_tensor_t& dout, const fva_tensor_t& dq,
                  const fva_tensor_t& dk, const fva_tensor_t& dv, void* ws, void* stream) {
  const QatBackwardPlan plan = plan_qat_backward(h, p);
  const LaunchChain chain(h.device, h.tuning);  // the call's kernels chained (kernel_images.h)
  const PreparedBuffers buf = prepared_buffers(plan.prepared, ws);
  float* const accumulator = workspace_pointer<float>(ws, plan.dq_accumulator);
  kern::AttentionParams a = describe(p, plan.prep, buf, q, k, v);
  // The fused backward's accumulator, zeroed ahead of the chain (wasted on the rare call whose
  // maps the driver then refuses).
  if (accumulator != nullptr) sm90_fused_backward_reset(accumulator, p.B, p.Hq, p.Sq, p.D, stream);
  fill_prepared(h, p, plan.prep, buf, a, q, k, v, false, stream);
  set_backward_tensors(a, o_for_bwd, dout, lse, dq, dk, dv, workspace_pointer<float>(ws, plan.delta));
  a.quantize_p = plan.quantize_p ? 1 : 0;
  const char* sfx = dtype_suffix(q.dtype);

  launch_delta(h, a, p.D, q.dtype, stream);

  kern::Sm90BackwardParams native;
  const bool sm90 = plan.family == KernelFamily::kSm90 && sm90_encode_backward(a, p.D, &native);
  if (sm90 && plan.dq == DqMode::kStoredDs) {  // dK/dV storing dS, then dQ from it
    sm90_stored_ds_backward_launch(h, Sm90Kind::kQat, native, p.D, q.dtype, plan.ds_chunks,
                                   workspace_pointer<char>(ws, plan.ds_tiles),
                                   static_cast<int32_t>((p.Sq + 63) / 64),
                                   static_cast<int32_t>((p.Skv + 63) / 64), stream);
    return;
  }
  if (sm90 && plan.dq == DqMode::kFusedAccumulator) {  // dK/dV with dQ reduced beside them
    sm90_fused_backward_launch(h, Sm90Kind::kQat, native, p.D, q.dtype, accumulator, stream);
    return;
  }
  Launch l;  // the portable kernels'
  if (sm90) {
    sm90_dq_launch(h, Sm90Kind::kQat, native, p.D, q.dtype, stream);
  } else {
    l.grid_x = blocks_for(p.Sq, 64);
    l.grid_y = static_cast<unsigned>(p.B * p.Hq);
    l.smem = static_cast<size_t>(kern::dq_smem_bytes(static_cast<int>(p.D)));
    launch("qat", KernelName("fva_qat_bwd_dq_", sfx, "_d", p.D).c_str(), h.device, l, stream, a);
  }
  if (sm90 && plan.sm90_dkdv) {
    sm90_dkdv_launch(h, Sm90Kind::kQat, native, p.D, q.dtype, stream);
    return;
  }
  l.grid_x = blocks_for(p.Skv, 64);
  l.grid_y = static_cast<unsigned>(p.B * p.Hkv);
  l.smem = static_cast<size_t>(kern::dkdv_smem_bytes(static_cast<int>(p.D)));
  const bool block_p = a.quantize_p == 0 || p.cfg.p_scale == FVA_SCALE_BLOCK;
  launch("qat", KernelName("fva_qat_bwd_dkdv_", sfx, "_d", p.D, block_p ? "_b" : "").c_str(),
         h.device, l, stream, a);
}

void nvfp4_fake_quantize(const fva_handle& h, const Nvfp4Problem& p, const fva_tensor_t& x,
                         const fva_tensor_t& y, void* stream) {
  require_kernel_dtype(x.dtype, "x");
  if (x.shape[0] * x.shape[1] > std::numeric_limits<int32_t>::max() ||
      x.shape[2] > std::numeric_limits<int32_t>::max() - 64)
    fail(FVA_ERR_UNSUPPORTED, "x: too large for the CUDA backend's 32-bit token indexing");
  const LaunchChain chain(h.device, h.tuning);  // the call's kernels chained (kernel_images.h)
  // (In block mode tile_tokens is not read; launch_quantize picks the unit.)
  launch_quantize(h, x.dtype, {{tensor4(x), tensor4(y), x.shape[1], x.shape[2], true, nullptr}},
                  x.shape[0], x.shape[3], p.scale_mode,
                  static_cast<int32_t>(std::min<int64_t>(p.tile_tokens, x.shape[2])), stream);
}

}  // namespace fva::cuda
