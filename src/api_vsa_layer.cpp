// Entry points of the whole VSA layer (SPEC.md section 3b): checks, then dispatch.
#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "cuda/stream_check.h"
#include "error.h"
#include "handle.h"

namespace fva {
namespace {

// The config is required: its topk has no default.
fva_vsa_layer_config_t checked_layer_config(const fva_vsa_layer_config_t* user) {
  if (user == nullptr)
    fail(FVA_ERR_INVALID_ARGUMENT,
         "cfg: is NULL but the VSA layer needs a config (FVA_VSA_LAYER_CONFIG_INIT, then set "
         "cfg->topk)");
  const fva_vsa_layer_config_t defaults = FVA_VSA_LAYER_CONFIG_INIT;
  const fva_vsa_layer_config_t c = read_config(user, defaults, "cfg", "fva_vsa_layer_config_t");
  check_softmax_scale(c.softmax_scale, "cfg->softmax_scale");
  check_vsa_block_size(c.block_size, "cfg->block_size");
  if (c.topk == 0)
    fail(FVA_ERR_INVALID_ARGUMENT,
         "cfg->topk is 0 but must be >= 1 (FVA_VSA_LAYER_CONFIG_INIT leaves it 0: set cfg->topk "
         "to the kv blocks each q block attends)");
  if (c.topk < 0) fail(FVA_ERR_INVALID_ARGUMENT, "cfg->topk is {} but must be >= 1", c.topk);
  return c;
}

void check_layer_sequence(const char* name, const fva_tensor_t* t) {
  if (t->shape[kS] % kVsaBlock != 0)
    fail(FVA_ERR_INVALID_ARGUMENT,
         "{}: shape[2] is {} but the VSA layer needs a multiple of {} (pad each block to 64 "
         "tokens, fva_vsa_tile_plan says where, and pass the real sizes in the block-size tensors)",
         name, t->shape[kS], kVsaBlock);
}

// Checks config, q, k and v; returns the resolved problem (gate not yet known: false).
VsaLayerProblem checked_layer_problem(const fva_vsa_layer_config_t* user_cfg, const fva_tensor_t* q,
                                      const fva_tensor_t* k, const fva_tensor_t* v) {
  const fva_vsa_layer_config_t cfg = checked_layer_config(user_cfg);
  check_qkv(q, k, v);
  check_layer_sequence("q", q);
  check_layer_sequence("k", k);
  if (q->shape[kD] != 64 && q->shape[kD] != 128)
    fail(FVA_ERR_UNSUPPORTED,
         "q: head dim shape[3] = {} is not supported; the VSA layer needs D = 64 or 128",
         q->shape[kD]);
  VsaLayerProblem p;
  VsaProblem& f = p.fine;
  f.scale = resolve_softmax_scale(cfg.softmax_scale, q->shape[kD]);
  f.dtype = q->dtype;
  f.B = q->shape[kB];
  f.Hq = q->shape[kH];
  f.Hkv = k->shape[kH];
  f.num_q_blocks = q->shape[kS] / kVsaBlock;
  f.num_kv_blocks = k->shape[kS] / kVsaBlock;
  f.D = q->shape[kD];
  p.topk = cfg.topk < f.num_kv_blocks ? cfg.topk : f.num_kv_blocks;
  f.max_k = p.topk;
  return p;
}

// q_block_sizes int32 [num_q_blocks], kv_block_sizes int32 [num_kv_blocks].
void check_block_sizes(const fva_tensor_t* q_block_sizes, const fva_tensor_t* kv_block_sizes,
                       const VsaLayerProblem& p) {
  check_tensor("q_block_sizes", q_block_sizes, 1, kI32Only, false, "[num_q_blocks]");
  check_dim_is("q_block_sizes", q_block_sizes, 0, p.fine.num_q_blocks,
               "num_q_blocks = q.shape[2] / 64");
  check_tensor("kv_block_sizes", kv_block_sizes, 1, kI32Only, false, "[num_kv_blocks]");
  check_dim_is("kv_block_sizes", kv_block_sizes, 0, p.fine.num_kv_blocks,
               "num_kv_blocks = k.shape[2] / 64");
}

// What the forward and the backward check first, in this order: the config, q, k, v, the gate
// (like q, or NULL) and the block sizes; returns the problem, its gate flag set.
VsaLayerProblem checked_layer_call(const fva_vsa_layer_config_t* cfg, const fva_tensor_t* q,
                                   const fva_tensor_t* k, const fva_tensor_t* v,
                                   const fva_tensor_t* gate, const fva_tensor_t* q_block_sizes,
                                   const fva_tensor_t* kv_block_sizes) {
  VsaLayerProblem p = checked_layer_problem(cfg, q, k, v);
  if (gate != nullptr) check_like("gate", gate, "q", q, false);
  p.gate = gate != nullptr;
  check_block_sizes(q_block_sizes, kv_block_sizes, p);
  return p;
}

// q2k_idx int32 [B, Hq, num_q_blocks, min(topk, num_kv_blocks)] and q2k_num int32
// [B, Hq, num_q_blocks]: both or neither.
void check_selection_outputs(const fva_tensor_t* q2k_idx, const fva_tensor_t* q2k_num,
                             const fva_tensor_t* q, const VsaLayerProblem& p) {
  if ((q2k_idx == nullptr) != (q2k_num == nullptr))
    fail(FVA_ERR_INVALID_ARGUMENT, "{}: is NULL but {} is given (pass both q2k_idx and q2k_num, or neither)",
         q2k_idx == nullptr ? "q2k_idx" : "q2k_num", q2k_idx == nullptr ? "q2k_num" : "q2k_idx");
  if (q2k_idx == nullptr) return;
  check_tensor("q2k_idx", q2k_idx, 4, kI32Only, true, "[B, H, num_q_blocks, topk]");
  check_dim_matches("q2k_idx", q2k_idx, 0, "q", q, kB);
  check_dim_matches("q2k_idx", q2k_idx, 1, "q", q, kH);
  check_dim_is("q2k_idx", q2k_idx, 2, p.fine.num_q_blocks, "num_q_blocks = q.shape[2] / 64");
  check_dim_is("q2k_idx", q2k_idx, 3, p.topk, "min(cfg->topk, num_kv_blocks)");
  check_tensor("q2k_num", q2k_num, 3, kI32Only, true, "[B, H, num_q_blocks]");
  for (int d = 0; d < 3; ++d) check_dim_matches("q2k_num", q2k_num, d, "q2k_idx", q2k_idx, d);
}

// gate and dgate: both given or both NULL.
void check_gate_pair(const fva_tensor_t* gate, const fva_tensor_t* dgate) {
  if ((gate == nullptr) == (dgate == nullptr)) return;
  if (gate == nullptr)
    fail(FVA_ERR_INVALID_ARGUMENT,
         "dgate: is given but gate is NULL (dgate is written exactly when the layer has a gate)");
  fail(FVA_ERR_INVALID_ARGUMENT,
       "dgate: is NULL but gate is given (the gate's gradient is an output of the backward)");
}

struct LayerSizes {
  size_t workspace = 0, reserve = 0;
};

LayerSizes layer_sizes(const fva_handle& h, const VsaLayerProblem& p) {
  if (h.backend == FVA_BACKEND_CPU) return {cpu::vsa_layer_workspace(p), cpu::vsa_layer_reserve_bytes(p)};
  cuda::require_vsa_layer_support(p, p.fine.dtype);
  const cuda::VsaLayerSizes s = cuda::vsa_layer_sizes(h, p);
  return {s.workspace, s.reserve};
}

// The reserve: non-null, 16-byte aligned, at least `need` bytes.
void check_reserve(const void* reserve, size_t reserve_bytes, size_t need) {
  if (reserve == nullptr)
    fail(FVA_ERR_INVALID_ARGUMENT,
         "reserve: is NULL but the VSA layer needs {} bytes of reserve (see fva_vsa_layer_sizes)",
         need);
  if (reinterpret_cast<uintptr_t>(reserve) % kRequiredAlignment != 0)
    fail(FVA_ERR_INVALID_ARGUMENT, "reserve: {} is not {}-byte aligned", reserve, kRequiredAlignment);
  if (reserve_bytes < need)
    fail(FVA_ERR_WORKSPACE_TOO_SMALL,
         "reserve_bytes is {} but this call needs {} bytes of reserve (see fva_vsa_layer_sizes)",
         reserve_bytes, need);
}

// The bytes of the reserve the call uses, as a tensor for the overlap check, in 4-byte elements:
// rounding up to a whole element never reaches a neighbour, which is 16-byte aligned like the
// reserve. A reserve of 0 bytes is none (data NULL).
fva_tensor_t reserve_extent(const void* reserve, size_t need) {
  fva_tensor_t t{};
  if (need == 0) return t;  // data NULL: check_no_overlap's absent argument
  t.data = const_cast<void*>(reserve);
  t.dtype = FVA_DTYPE_I32;
  t.rank = 1;
  t.shape[0] = static_cast<int64_t>((need + 3) / 4);
  t.strides[0] = 1;
  return t;
}

}  // namespace
}  // namespace fva

extern "C" {

fva_status_t fva_vsa_layer_sizes(fva_handle_t h, const fva_vsa_layer_config_t* cfg,
                                 const fva_tensor_t* q, const fva_tensor_t* k,
                                 const fva_tensor_t* v, size_t* workspace_bytes,
                                 size_t* reserve_bytes) {
  return fva::guard([&] {
    using namespace fva;
    const fva_handle& handle = checked_handle(h);
    check_not_null(workspace_bytes, "workspace_bytes");
    check_not_null(reserve_bytes, "reserve_bytes");
    const VsaLayerProblem p = checked_layer_problem(cfg, q, k, v);
    require_backend_support(handle, "fva_vsa_layer_sizes");
    const LayerSizes s = layer_sizes(handle, p);
    *workspace_bytes = s.workspace;
    *reserve_bytes = s.reserve;
  });
}

fva_status_t fva_vsa_layer_forward(fva_handle_t h, const fva_vsa_layer_config_t* cfg,
                                   const fva_tensor_t* q, const fva_tensor_t* k,
                                   const fva_tensor_t* v, const fva_tensor_t* gate,
                                   const fva_tensor_t* q_block_sizes,
                                   const fva_tensor_t* kv_block_sizes, const fva_tensor_t* out,
                                   const fva_tensor_t* q2k_idx, const fva_tensor_t* q2k_num,
                                   void* reserve, size_t reserve_bytes, void* ws, size_t ws_bytes,
                                   void* stream) {
  return fva::guard([&] {
    using namespace fva;
    const fva_handle& handle = checked_handle(h);
    const VsaLayerProblem p =
        checked_layer_call(cfg, q, k, v, gate, q_block_sizes, kv_block_sizes);
    check_like("out", out, "q", q, true);
    check_selection_outputs(q2k_idx, q2k_num, q, p);
    require_backend_support(handle, "fva_vsa_layer_forward");
    const LayerSizes need = layer_sizes(handle, p);
    check_reserve(reserve, reserve_bytes, need.reserve);
    const fva_tensor_t res = reserve_extent(reserve, need.reserve);
    check_no_overlap({{"q", q, false}, {"k", k, false}, {"v", v, false}, {"gate", gate, false},
                      {"q_block_sizes", q_block_sizes, false},
                      {"kv_block_sizes", kv_block_sizes, false}, {"out", out, true},
                      {"q2k_idx", q2k_idx, true}, {"q2k_num", q2k_num, true},
                      {"reserve", res.data ? &res : nullptr, true}});
    check_workspace(ws, ws_bytes, need.workspace, "fva_vsa_layer_sizes");
    if (handle.backend == FVA_BACKEND_CUDA) {
      cuda::check_launch_context(handle.device, stream);
      cuda::vsa_layer_forward(handle, p, *q, *k, *v, gate, *q_block_sizes, *kv_block_sizes, *out,
                              q2k_idx, q2k_num, reserve, ws, stream);
      return;
    }

    const cpu::AttnView gate_view = gate ? cpu::AttnView::of(*gate) : cpu::AttnView{};
    const cpu::I32View idx_view = q2k_idx ? cpu::I32View::of(*q2k_idx) : cpu::I32View{};
    const cpu::I32View num_view = q2k_num ? cpu::I32View::of(*q2k_num) : cpu::I32View{};
    cpu::vsa_layer_forward(p, cpu::AttnView::of(*q), cpu::AttnView::of(*k), cpu::AttnView::of(*v),
                           gate ? &gate_view : nullptr, cpu::I32View::of(*q_block_sizes),
                           cpu::I32View::of(*kv_block_sizes), cpu::AttnView::of(*out),
                           q2k_idx ? &idx_view : nullptr, q2k_num ? &num_view : nullptr, reserve,
                           ws, handle.threads);
  });
}

fva_status_t fva_vsa_layer_backward(fva_handle_t h, const fva_vsa_layer_config_t* cfg,
                                    const fva_tensor_t* q, const fva_tensor_t* k,
                                    const fva_tensor_t* v, const fva_tensor_t* gate,
                                    const fva_tensor_t* q_block_sizes,
                                    const fva_tensor_t* kv_block_sizes, const fva_tensor_t* dout,
                                    const void* reserve, size_t reserve_bytes,
                                    const fva_tensor_t* dq, const fva_tensor_t* dk,
                                    const fva_tensor_t* dv, const fva_tensor_t* dgate, void* ws,
                                    size_t ws_bytes, void* stream) {
  return fva::guard([&] {
    using namespace fva;
    const fva_handle& handle = checked_handle(h);
    const VsaLayerProblem p =
        checked_layer_call(cfg, q, k, v, gate, q_block_sizes, kv_block_sizes);
    check_like("dout", dout, "q", q, false);
    check_like("dq", dq, "q", q, true);
    check_like("dk", dk, "k", k, true);
    check_like("dv", dv, "v", v, true);
    check_gate_pair(gate, dgate);
    if (dgate != nullptr) check_like("dgate", dgate, "q", q, true);
    require_backend_support(handle, "fva_vsa_layer_backward");
    const LayerSizes need = layer_sizes(handle, p);
    check_reserve(reserve, reserve_bytes, need.reserve);
    const fva_tensor_t res = reserve_extent(reserve, need.reserve);
    check_no_overlap({{"q", q, false}, {"k", k, false}, {"v", v, false}, {"gate", gate, false},
                      {"q_block_sizes", q_block_sizes, false},
                      {"kv_block_sizes", kv_block_sizes, false}, {"dout", dout, false},
                      {"reserve", res.data ? &res : nullptr, false}, {"dq", dq, true}, {"dk", dk, true},
                      {"dv", dv, true}, {"dgate", dgate, true}});
    check_workspace(ws, ws_bytes, need.workspace, "fva_vsa_layer_sizes");
    if (handle.backend == FVA_BACKEND_CUDA) {
      cuda::check_launch_context(handle.device, stream);
      cuda::vsa_layer_backward(handle, p, *q, *k, *v, gate, *q_block_sizes, *kv_block_sizes, *dout,
                               reserve, *dq, *dk, *dv, dgate, ws, stream);
      return;
    }

    cpu::check_vsa_layer_reserve(p, reserve);
    const cpu::AttnView gate_view = gate ? cpu::AttnView::of(*gate) : cpu::AttnView{};
    const cpu::AttnView dgate_view = dgate ? cpu::AttnView::of(*dgate) : cpu::AttnView{};
    cpu::vsa_layer_backward(p, cpu::AttnView::of(*q), cpu::AttnView::of(*k), cpu::AttnView::of(*v),
                            gate ? &gate_view : nullptr, cpu::I32View::of(*q_block_sizes),
                            cpu::I32View::of(*kv_block_sizes), cpu::AttnView::of(*dout), reserve,
                            cpu::AttnView::of(*dq), cpu::AttnView::of(*dk), cpu::AttnView::of(*dv),
                            dgate ? &dgate_view : nullptr, ws, handle.threads);
  });
}

}  // extern "C"
