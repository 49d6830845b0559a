// Entry points of QAT attention and of NVFP4 fake quantization: argument checks, then dispatch.
#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "cuda/stream_check.h"
#include "error.h"
#include "handle.h"

namespace fva {
namespace {

bool qat_head_dim_supported(int64_t d) {
  return d == 16 || d == 32 || d == 64 || d == 128 || d == 256;
}

fva_qat_config_t checked_qat_config(const fva_qat_config_t* user) {
  const fva_qat_config_t defaults = FVA_QAT_CONFIG_INIT;
  const fva_qat_config_t c = read_config(user, defaults, "cfg", "fva_qat_config_t");
  check_softmax_scale(c.softmax_scale, "cfg->softmax_scale");
  check_flag(c.causal, "cfg->causal");
  check_flag(c.quantize, "cfg->quantize");
  check_flag(c.smooth_k, "cfg->smooth_k");
  check_flag(c.quantize_p_backward, "cfg->quantize_p_backward");
  check_flag(c.high_precision_o, "cfg->high_precision_o");
  check_flag(c.quantized_qkv_backward, "cfg->quantized_qkv_backward");
  if (c.qkv_scale != FVA_SCALE_BLOCK && c.qkv_scale != FVA_SCALE_TILE)
    fail(FVA_ERR_INVALID_ARGUMENT,
         "cfg->qkv_scale is {} but must be FVA_SCALE_BLOCK (0) or FVA_SCALE_TILE (1)", c.qkv_scale);
  if (c.p_scale != FVA_SCALE_BLOCK && c.p_scale != FVA_SCALE_TILE && c.p_scale != FVA_SCALE_ROW)
    fail(FVA_ERR_INVALID_ARGUMENT,
         "cfg->p_scale is {} but must be FVA_SCALE_BLOCK (0), FVA_SCALE_TILE (1) or FVA_SCALE_ROW (2)",
         c.p_scale);
  return c;
}

// Checks q, k, v and the config; returns the resolved problem.
QatProblem checked_qat_problem(const fva_qat_config_t* user_cfg, const fva_tensor_t* q,
                                    const fva_tensor_t* k, const fva_tensor_t* v) {
  const fva_qat_config_t cfg = checked_qat_config(user_cfg);
  check_qkv(q, k, v);
  if (!qat_head_dim_supported(q->shape[kD]))
    fail(FVA_ERR_UNSUPPORTED, "q: head dim shape[3] = {} is not supported; D must be 16, 32, 64, 128 or 256",
         q->shape[kD]);
  QatProblem p;
  p.cfg = cfg;
  p.scale = resolve_softmax_scale(cfg.softmax_scale, q->shape[kD]);
  p.dtype = q->dtype;
  p.B = q->shape[kB];
  p.Hq = q->shape[kH];
  p.Hkv = k->shape[kH];
  p.Sq = q->shape[kS];
  p.Skv = k->shape[kS];
  p.D = q->shape[kD];
  return p;
}

size_t forward_workspace(const fva_handle& h, const QatProblem& p) {
  if (h.backend == FVA_BACKEND_CPU) return cpu::qat_forward_workspace(p);
  cuda::require_qat_support(p, p.dtype);
  return cuda::qat_forward_workspace(h, p);
}

size_t backward_workspace(const fva_handle& h, const QatProblem& p) {
  if (h.backend == FVA_BACKEND_CPU) return cpu::qat_backward_workspace(p);
  cuda::require_qat_support(p, p.dtype);
  return cuda::qat_backward_workspace(h, p);
}

}  // namespace
}  // namespace fva

extern "C" {

fva_status_t fva_qat_forward_workspace_size(fva_handle_t h, const fva_qat_config_t* cfg,
                                            const fva_tensor_t* q, const fva_tensor_t* k,
                                            const fva_tensor_t* v, size_t* bytes) {
  using namespace fva;
  return workspace_query(
      h, bytes, "fva_qat_forward_workspace_size", [&] { return checked_qat_problem(cfg, q, k, v); },
      forward_workspace);
}

fva_status_t fva_qat_forward(fva_handle_t h, const fva_qat_config_t* cfg, const fva_tensor_t* q,
                             const fva_tensor_t* k, const fva_tensor_t* v, const fva_tensor_t* o,
                             const fva_tensor_t* o_hp, const fva_tensor_t* lse, void* ws,
                             size_t ws_bytes, void* stream) {
  return fva::guard([&] {
    using namespace fva;
    const fva_handle& handle = checked_handle(h);
    const QatProblem p = checked_qat_problem(cfg, q, k, v);
    check_like("o", o, "q", q, true);
    if (p.cfg.high_precision_o) {
      if (o_hp == nullptr)
        fail(FVA_ERR_INVALID_ARGUMENT, "o_hp: is NULL but cfg->high_precision_o is 1");
      check_like("o_hp", o_hp, "q", q, true);
    } else if (o_hp != nullptr) {
      fail(FVA_ERR_INVALID_ARGUMENT, "o_hp: must be NULL when cfg->high_precision_o is 0");
    }
    check_lse(lse, q, true);
    check_no_overlap({{"q", q, false}, {"k", k, false}, {"v", v, false}, {"o", o, true},
                      {"o_hp", o_hp, true}, {"lse", lse, true}});
    require_backend_support(handle, "fva_qat_forward");
    check_workspace(ws, ws_bytes, forward_workspace(handle, p), "fva_qat_forward_workspace_size");
    if (handle.backend == FVA_BACKEND_CUDA) {
      cuda::check_launch_context(handle.device, stream);
      cuda::qat_forward(handle, p, *q, *k, *v, *o, o_hp, *lse, ws, stream);
      return;
    }

    const cpu::AttnView o_hp_view = o_hp ? cpu::AttnView::of(*o_hp) : cpu::AttnView{};
    cpu::qat_forward(p, cpu::AttnView::of(*q), cpu::AttnView::of(*k), cpu::AttnView::of(*v),
                     cpu::AttnView::of(*o), o_hp ? &o_hp_view : nullptr, cpu::F32View::of(*lse),
                     ws, handle.threads);
  });
}

fva_status_t fva_qat_backward_workspace_size(fva_handle_t h, const fva_qat_config_t* cfg,
                                             const fva_tensor_t* q, const fva_tensor_t* k,
                                             const fva_tensor_t* v, size_t* bytes) {
  using namespace fva;
  return workspace_query(
      h, bytes, "fva_qat_backward_workspace_size", [&] { return checked_qat_problem(cfg, q, k, v); },
      backward_workspace);
}

fva_status_t fva_qat_backward(fva_handle_t h, const fva_qat_config_t* cfg, const fva_tensor_t* q,
                              const fva_tensor_t* k, const fva_tensor_t* v,
                              const fva_tensor_t* o_for_bwd, const fva_tensor_t* lse,
                              const fva_tensor_t* dout, const fva_tensor_t* dq,
                              const fva_tensor_t* dk, const fva_tensor_t* dv, void* ws,
                              size_t ws_bytes, void* stream) {
  return fva::guard([&] {
    using namespace fva;
    const fva_handle& handle = checked_handle(h);
    const QatProblem p = checked_qat_problem(cfg, q, k, v);
    check_like("o_for_bwd", o_for_bwd, "q", q, false);
    check_lse(lse, q, false);
    check_like("dout", dout, "q", q, false);
    check_like("dq", dq, "q", q, true);
    check_like("dk", dk, "k", k, true);
    check_like("dv", dv, "v", v, true);
    check_no_overlap({{"q", q, false}, {"k", k, false}, {"v", v, false},
                      {"o_for_bwd", o_for_bwd, false}, {"lse", lse, false}, {"dout", dout, false},
                      {"dq", dq, true}, {"dk", dk, true}, {"dv", dv, true}});
    require_backend_support(handle, "fva_qat_backward");
    check_workspace(ws, ws_bytes, backward_workspace(handle, p), "fva_qat_backward_workspace_size");
    if (handle.backend == FVA_BACKEND_CUDA) {
      cuda::check_launch_context(handle.device, stream);
      cuda::qat_backward(handle, p, *q, *k, *v, *o_for_bwd, *lse, *dout, *dq, *dk, *dv, ws, stream);
      return;
    }

    cpu::qat_backward(p, cpu::AttnView::of(*q), cpu::AttnView::of(*k), cpu::AttnView::of(*v),
                      cpu::AttnView::of(*o_for_bwd), cpu::F32View::of(*lse),
                      cpu::AttnView::of(*dout), cpu::AttnView::of(*dq), cpu::AttnView::of(*dk),
                      cpu::AttnView::of(*dv), ws, handle.threads);
  });
}

fva_status_t fva_nvfp4_fake_quantize(fva_handle_t h, const fva_nvfp4_config_t* cfg,
                                     const fva_tensor_t* x, const fva_tensor_t* y, void* stream) {

  return fva::guard([&] {
    using namespace fva;
    const fva_handle& handle = checked_handle(h);
    const fva_nvfp4_config_t defaults = FVA_NVFP4_CONFIG_INIT;
    const fva_nvfp4_config_t c = read_config(cfg, defaults, "cfg", "fva_nvfp4_config_t");
    if (c.scale_mode != FVA_SCALE_BLOCK && c.scale_mode != FVA_SCALE_TILE)
      fail(FVA_ERR_INVALID_ARGUMENT,
           "cfg->scale_mode is {} but must be FVA_SCALE_BLOCK (0) or FVA_SCALE_TILE (1)",
           c.scale_mode);
    if (c.scale_mode == FVA_SCALE_TILE && c.tile_tokens < 1)
      fail(FVA_ERR_INVALID_ARGUMENT, "cfg->tile_tokens is {} but must be >= 1", c.tile_tokens);
    check_attention_tensor("x", x, false);
    if (x->shape[kD] % 16 != 0)
      fail(FVA_ERR_INVALID_ARGUMENT,
           "x: shape[3] is {} but must be a multiple of 16 (the NVFP4 group size)", x->shape[kD]);
    check_like("y", y, "x", x, true);
    bool in_place = x->data == y->data;
    for (int d = 0; d < 4 && in_place; ++d) in_place = x->strides[d] == y->strides[d];
    if (!in_place) check_no_overlap({{"x", x, false}, {"y", y, true}});
    require_backend_support(handle, "fva_nvfp4_fake_quantize");

    Nvfp4Problem p;
    p.scale_mode = c.scale_mode;
    p.tile_tokens = c.tile_tokens;
    if (handle.backend == FVA_BACKEND_CUDA) {
      cuda::check_launch_context(handle.device, stream);
      cuda::nvfp4_fake_quantize(handle, p, *x, *y, stream);
      return;
    }
    cpu::nvfp4_fake_quantize(p, cpu::AttnView::of(*x), cpu::AttnView::of(*y), handle.threads);
  });
}

}  // extern "C"
