// QAT attention and NVFP4 fake quantization on the CUDA backend. A call is a short sequence of
// launches on the caller's stream:
//   [k mean (smooth_k): partial sums, final]  [NVFP4 fake quantization of q, k, v into the workspace]
//   forward: attention kernel (sm_90: the native one of sm90_forward.h where it applies)
//   |  backward: Delta, dQ kernel, dK/dV kernel (sm_90: the native one where it applies).
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "shared/key_order.h"
#include "cuda_ops.h"
#include "error.h"
#include "kernel_images.h"
#include "params.h"
#include "sm90_kernels.h"

namespace fva::cuda {
namespace {

constexpr int kQatTileTokens = 32;   // the CPU reference's (and FastVideo's) Q/K/V tile
constexpr int kMeanChunkTokens = 256;

int64_t mean_chunks(const cpu::QatProblem& p) {
  return p.B * p.Hkv * ((p.Skv + kMeanChunkTokens - 1) / kMeanChunkTokens);
}

// Which inputs are replaced by prepared copies in the workspace. padded_kv: the copies of K and V
// hold whole 64-key tiles per (b, head) (the forward's quantized K and V, which the Hopper forward
// reads in its own key order, shared/key_order.h).
struct Prepared {
  bool q = false, k = false, v = false, mean = false, padded_kv = false;
};
Prepared prepared(const cpu::QatProblem& p, bool quantize, bool forward) {
  Prepared r;
  r.mean = p.cfg.smooth_k != 0;
  r.q = r.v = quantize;
  r.k = quantize || r.mean;
  r.padded_kv = forward && quantize;
  return r;
}
// The rows per (b, head) of the prepared K and V copies.
int64_t kv_rows(const cpu::QatProblem& p, const Prepared& prep) {
  return prep.padded_kv ? owned_padded_rows(p.Skv) : p.Skv;
}

struct QatBuffers {
  void* fq = nullptr;
  void* fk = nullptr;
  void* fv = nullptr;
  float* k_mean = nullptr;
  double* mean_partial = nullptr;
  float* delta = nullptr;
  float* dq_accumulator = nullptr;  // the fused sm_90a backward's (sm90_fuses_dq)
  void* ds_tiles = nullptr;         // the stored-dS sm_90a backward's (sm90_ds_chunks)
};

// How the sm_90a backward computes dQ: from dS tiles its dK/dV kernel stores (within the
// workspace budget; bitwise reproducible), by reductions into an fp32 accumulator inside dK/dV
// (handles that are not deterministic, D = 128), or by the dQ kernel that recomputes S and dP. The
// workspace query and the call ask alike.
struct DqPath {
  Sm90DsChunks stored;  // kv_units_per_chunk > 0: stored dS
  bool fused = false;
};

// One layout for sizing and carving: prepared tensors, the mean, then (backward) Delta and, when
// the sm_90a dK/dV kernel reduces dQ, its fp32 accumulator; (forward) the split tail's pieces'
// states and flags, which *split receives.
QatBuffers carve(const cpu::QatProblem& p, const Prepared& prep, bool backward, const DqPath& dq,
                 WorkspaceCarver& c, Sm90ForwardSplit* split = nullptr) {
  QatBuffers b;
  if (prep.q) b.fq = c.take<uint16_t>(static_cast<size_t>(p.B * p.Hq * p.Sq * p.D));
  const int64_t kv = kv_rows(p, prep);
  if (prep.k) b.fk = c.take<uint16_t>(static_cast<size_t>(p.B * p.Hkv * kv * p.D));
  if (prep.v) b.fv = c.take<uint16_t>(static_cast<size_t>(p.B * p.Hkv * kv * p.D));
  if (prep.mean) {
    b.k_mean = c.take<float>(static_cast<size_t>(p.D));
    b.mean_partial = c.take<double>(static_cast<size_t>(mean_chunks(p) * p.D));
  }
  if (backward) b.delta = c.take<float>(static_cast<size_t>(p.B * p.Hq * p.Sq));
  if (dq.fused)
    b.dq_accumulator = c.take<float>(
        static_cast<size_t>(kern::sm90_dq_accumulator_bytes(p.B, p.Hq, p.Sq, p.D) / 4));
  if (dq.stored.kv_units_per_chunk > 0) b.ds_tiles = c.take<char>(dq.stored.bytes);
  if (split != nullptr && split->pieces > 1) {
    split->partials = c.take<float>(split->partial_floats());
    split->flags = c.take<uint32_t>(2 * split->flag_words());
    if (split->quantize_p) split->maxima = c.take<float>(split->maxima_floats());
  }
  return b;
}

// The native forward's tail split for this call (sm90_qat_forward_split).
Sm90ForwardSplit forward_split(const fva_handle& h, const cpu::QatProblem& p) {
  return sm90_qat_forward_split(h, p.B, p.Hq, p.Sq, p.Skv, p.D, p.cfg.causal != 0,
                                p.cfg.quantize != 0, p.cfg.p_scale);
}

// The backward's quantization: FastVideo's use_qat_qkv_backward = 0 runs it on the unquantized
// (smoothed) inputs; quantize_p_backward = 0 gives dV the unquantized P.
bool backward_quantizes_qkv(const cpu::QatProblem& p) {
  return p.cfg.quantize != 0 && p.cfg.quantized_qkv_backward != 0;
}
bool backward_quantizes_p(const cpu::QatProblem& p) {
  return p.cfg.quantize != 0 && p.cfg.quantize_p_backward != 0;
}
int64_t tiles_of(int64_t n) { return (n + 63) / 64; }
DqPath dq_path(const fva_handle& h, const cpu::QatProblem& p) {
  DqPath path;
  if (!sm90_dkdv_covers(Sm90Kind::kQat, backward_quantizes_p(p), p.cfg.p_scale)) return path;
  // A tile per q head, query tile and key tile (causal: the pairs above the diagonal stay unused).
  path.stored = sm90_ds_chunks(h, p.D, p.B * p.Hkv,
                               (p.Hq / p.Hkv) * tiles_of(p.Sq) * tiles_of(p.Skv));
  path.fused = path.stored.kv_units_per_chunk == 0 && sm90_fuses_dq(h, Sm90Kind::kQat, p.D);
  return path;
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
  launch("prep",
         fmt::format("fva_nvfp4_quantize_{}{}{}", block_mode ? "" : "tile_", dtype_suffix(dtype),
                     fixed_d ? fmt::format("_d{}", D) : "")
             .c_str(),
         h.device, l, stream, q);
}

// The call's parameters, with the prepared copies in place of the inputs they replace.
kern::AttentionParams describe(const cpu::QatProblem& p, const Prepared& prep, const QatBuffers& buf,
                               const fva_tensor_t& q, const fva_tensor_t& k, const fva_tensor_t& v) {
  kern::AttentionParams a{};
  a.q = prep.q ? contiguous4(buf.fq, p.Hq, p.Sq, p.D) : tensor4(q);
  a.k = prep.k ? contiguous4(buf.fk, p.Hkv, kv_rows(p, prep), p.D) : tensor4(k);
  a.v = prep.v ? contiguous4(buf.fv, p.Hkv, kv_rows(p, prep), p.D) : tensor4(v);
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
void fill_prepared(const fva_handle& h, const cpu::QatProblem& p, bool quantize,
                   const Prepared& prep, const QatBuffers& buf, const kern::AttentionParams& a,
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
    launch("prep", fmt::format("fva_k_mean_partial_{}", sfx).c_str(), h.device, l, stream, m);
    l.grid_x = 1;
    launch("prep", fmt::format("fva_k_mean_final_{}", sfx).c_str(), h.device, l, stream, m);
  }
  // (The k mean, above, is complete before the quantization: same stream.)
  std::vector<QuantizeTensor> jobs;
  if (prep.q) jobs.push_back({tensor4(q), a.q, p.Hq, p.Sq, true, nullptr});
  if (prep.k) jobs.push_back({tensor4(k), a.k, p.Hkv, p.Skv, quantize, buf.k_mean, owned_kv_order});
  if (prep.v) jobs.push_back({tensor4(v), a.v, p.Hkv, p.Skv, true, nullptr, owned_kv_order});
  launch_quantize(h, dtype, jobs, p.B, p.D, p.cfg.qkv_scale, kQatTileTokens, stream);
}

}  // namespace

void require_qat_support(const cpu::QatProblem& p, int32_t dtype) {
  require_attention_kernels(p.D, dtype, p.B * p.Hq);
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  if (p.Sq > kMaxInt - 64 || p.Skv > kMaxInt - 64)
    fail(FVA_ERR_UNSUPPORTED, "q/k: sequence lengths above 2^31 - 65 are not supported by the CUDA backend");
}

size_t qat_forward_workspace(const fva_handle& h, const cpu::QatProblem& p) {
  WorkspaceCarver c(nullptr);
  Sm90ForwardSplit split = forward_split(h, p);
  carve(p, prepared(p, p.cfg.quantize != 0, true), false, DqPath{}, c, &split);
  return c.bytes();
}

size_t qat_backward_workspace(const fva_handle& h, const cpu::QatProblem& p) {
  WorkspaceCarver c(nullptr);
  carve(p, prepared(p, backward_quantizes_qkv(p), false), true, dq_path(h, p), c);
  return c.bytes();
}

void qat_forward(const fva_handle& h, const cpu::QatProblem& p, const fva_tensor_t& q,
                 const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& o,
                 const fva_tensor_t* o_hp, const fva_tensor_t& lse, void* ws, void* stream) {
  ensure_context(h.device);
  const LaunchChain chain(h.device);  // the call's kernels chained (kernel_images.h)
  const bool quantize = p.cfg.quantize != 0;
  const Prepared prep = prepared(p, quantize, true);
  WorkspaceCarver c(ws);
  Sm90ForwardSplit split = forward_split(h, p);
  const QatBuffers buf = carve(p, prep, false, DqPath{}, c, &split);
  kern::AttentionParams a = describe(p, prep, buf, q, k, v);
  a.o = tensor4(o);
  a.o_hp = o_hp ? tensor4(*o_hp) : kern::Tensor4{};
  a.lse = tensor3(lse);
  // sm_90: the Hopper-native forward where it covers the call, decided before the preparation:
  // with quantized P it reads K and V in its own key order (shared/key_order.h), which the portable
  // kernel does not, and its maps cover the copies' whole tiles.
  // (The padded copies are exactly the quantized forward's, whose K and V take that order.)
  kern::Sm90ForwardParams native;
  if (sm90_forward_prepare(h, Sm90Kind::kQat, a, p.D, quantize, p.cfg.p_scale, &native,
                           kv_rows(p, prep))) {
    sm90_forward_split_reset(split, stream);
    fill_prepared(h, p, quantize, prep, buf, a, q, k, v, prep.padded_kv, stream);
    sm90_forward_launch(h, Sm90Kind::kQat, native, p.D, q.dtype, quantize, stream, &split);
    return;
  }
  fill_prepared(h, p, quantize, prep, buf, a, q, k, v, false, stream);
  Launch l;
  l.grid_x = blocks_for(p.Sq, 64);
  l.grid_y = static_cast<unsigned>(p.B * p.Hq);
  l.smem = static_cast<size_t>(kern::forward_smem_bytes(static_cast<int>(p.D)));
  // Block P scales (the production preset) have their own, leaner kernel.
  const char* variant = !quantize ? "q0" : p.cfg.p_scale == FVA_SCALE_BLOCK ? "q1b" : "q1";
  const std::string name = fmt::format("fva_qat_fwd_{}_d{}_{}", dtype_suffix(q.dtype), p.D, variant);
  launch("qat", name.c_str(), h.device, l, stream, a);
}

unsigned launch_delta(const fva_handle& h, const kern::AttentionParams& a, int64_t D, int32_t dtype,
                      void* stream, unsigned max_blocks) {
  Launch l;  // 128 threads: 4 warps
  l.grid_x = blocks_for(static_cast<int64_t>(a.B) * a.Hq * a.Sq,
                        4 * kern::delta_rows_per_warp(static_cast<int>(D)));
  if (max_blocks > 0) l.grid_x = std::min(l.grid_x, max_blocks);
  launch("prep", fmt::format("fva_delta_{}_d{}", dtype_suffix(dtype), D).c_str(), h.device, l,
         stream, a);
  return l.grid_x;
}

void qat_backward(const fva_handle& h, const cpu::QatProblem& p, const fva_tensor_t& q,
                  const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& o_for_bwd,
                  const fva_tensor_t& lse, const fva_tensor_t& dout, const fva_tensor_t& dq,
                  const fva_tensor_t& dk, const fva_tensor_t& dv, void* ws, void* stream) {
  ensure_context(h.device);
  const LaunchChain chain(h.device);  // the call's kernels chained (kernel_images.h)
  const bool quantize = backward_quantizes_qkv(p);
  const Prepared prep = prepared(p, quantize, false);
  const DqPath path = dq_path(h, p);
  WorkspaceCarver c(ws);
  const QatBuffers buf = carve(p, prep, true, path, c);
  kern::AttentionParams a = describe(p, prep, buf, q, k, v);
  // The fused backward's accumulator, zeroed ahead of the chain (wasted on the rare call that
  // sm90_backward_prepare then turns away).
  if (buf.dq_accumulator != nullptr)
    sm90_fused_backward_reset(buf.dq_accumulator, p.B, p.Hq, p.Sq, p.D, stream);
  fill_prepared(h, p, quantize, prep, buf, a, q, k, v, false, stream);
  set_backward_tensors(a, o_for_bwd, dout, lse, dq, dk, dv, buf.delta);
  a.quantize_p = backward_quantizes_p(p) ? 1 : 0;
  const char* sfx = dtype_suffix(q.dtype);

  launch_delta(h, a, p.D, q.dtype, stream);

  // sm_90: the Hopper-native dQ, and dK/dV where it covers the P scale mode.
  kern::Sm90BackwardParams native;
  const bool sm90 = sm90_backward_prepare(h, a, p.D, &native);
  if (sm90 && path.stored.kv_units_per_chunk > 0) {  // dK/dV storing dS, then dQ from it
    sm90_stored_ds_backward_launch(h, Sm90Kind::kQat, native, p.D, q.dtype, path.stored,
                                   buf.ds_tiles, static_cast<int32_t>(tiles_of(p.Sq)),
                                   static_cast<int32_t>(tiles_of(p.Skv)), stream);
    return;
  }
  if (sm90 && path.fused) {  // dK/dV with dQ reduced beside them (not bitwise reproducible)
    sm90_fused_backward_launch(h, Sm90Kind::kQat, native, p.D, q.dtype, buf.dq_accumulator, stream);
    return;
  }
  Launch l;  // the portable kernels'
  if (sm90) {
    sm90_dq_launch(h, Sm90Kind::kQat, native, p.D, q.dtype, stream);
  } else {
    l.grid_x = blocks_for(p.Sq, 64);
    l.grid_y = static_cast<unsigned>(p.B * p.Hq);
    l.smem = static_cast<size_t>(kern::dq_smem_bytes(static_cast<int>(p.D)));
    launch("qat", fmt::format("fva_qat_bwd_dq_{}_d{}", sfx, p.D).c_str(), h.device, l, stream, a);
  }
  if (sm90 && sm90_dkdv_covers(Sm90Kind::kQat, a.quantize_p != 0, p.cfg.p_scale)) {
    sm90_dkdv_launch(h, Sm90Kind::kQat, native, p.D, q.dtype, stream);
    return;
  }
  l.grid_x = blocks_for(p.Skv, 64);
  l.grid_y = static_cast<unsigned>(p.B * p.Hkv);
  l.smem = static_cast<size_t>(kern::dkdv_smem_bytes(static_cast<int>(p.D)));
  const bool block_p = a.quantize_p == 0 || p.cfg.p_scale == FVA_SCALE_BLOCK;
  launch("qat", fmt::format("fva_qat_bwd_dkdv_{}_d{}{}", sfx, p.D, block_p ? "_b" : "").c_str(),
         h.device, l, stream, a);
}

void nvfp4_fake_quantize(const fva_handle& h, const cpu::Nvfp4Problem& p, const fva_tensor_t& x,
                         const fva_tensor_t& y, void* stream) {
  require_kernel_dtype(x.dtype, "x");
  if (x.shape[0] * x.shape[1] > std::numeric_limits<int32_t>::max() ||
      x.shape[2] > std::numeric_limits<int32_t>::max() - 64)
    fail(FVA_ERR_UNSUPPORTED, "x: too large for the CUDA backend's 32-bit token indexing");
  ensure_context(h.device);
  const LaunchChain chain(h.device);  // the call's kernels chained (kernel_images.h)
  // (In block mode tile_tokens is not read; launch_quantize picks the unit.)
  launch_quantize(h, x.dtype, {{tensor4(x), tensor4(y), x.shape[1], x.shape[2], true, nullptr}},
                  x.shape[0], x.shape[3], p.scale_mode,
                  static_cast<int32_t>(std::min<int64_t>(p.tile_tokens, x.shape[2])), stream);
}

}  // namespace fva::cuda
