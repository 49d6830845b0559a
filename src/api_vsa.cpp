// Entry points of VSA block-sparse attention and of its index inversion: checks, then dispatch.
#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "cuda/stream_check.h"
#include "error.h"
#include "handle.h"

namespace fva {
namespace {

fva_vsa_config_t checked_vsa_config(const fva_vsa_config_t* user) {
  const fva_vsa_config_t defaults = FVA_VSA_CONFIG_INIT;
  const fva_vsa_config_t c = read_config(user, defaults, "cfg", "fva_vsa_config_t");
  check_softmax_scale(c.softmax_scale, "cfg->softmax_scale");
  check_vsa_block_size(c.block_size, "cfg->block_size");
  return c;
}

void check_sequence_blocks(const char* name, const fva_tensor_t* t) {
  if (t->shape[kS] % kVsaBlock != 0)
    fail(FVA_ERR_INVALID_ARGUMENT,
         "{}: shape[2] is {} but VSA needs a multiple of {} (pad each block to 64 tokens and pass "
         "the real sizes in block_sizes)",
         name, t->shape[kS], kVsaBlock);
}

// q2k_idx: int32 [B, Hq, num_q_blocks, max_k].
void check_q2k_idx(const fva_tensor_t* idx, const fva_tensor_t* q) {
  check_tensor("q2k_idx", idx, 4, kI32Only, false, "[B, H, num_q_blocks, max_k]");
  check_dim_matches("q2k_idx", idx, 0, "q", q, kB);
  check_dim_matches("q2k_idx", idx, 1, "q", q, kH);
  check_dim_is("q2k_idx", idx, 2, q->shape[kS] / kVsaBlock, "num_q_blocks = q.shape[2] / 64");
}

// Checks config, q, k, v and q2k_idx; returns the resolved problem.
VsaProblem checked_vsa_problem(const fva_vsa_config_t* user_cfg, const fva_tensor_t* q,
                                    const fva_tensor_t* k, const fva_tensor_t* v,
                                    const fva_tensor_t* q2k_idx) {
  const fva_vsa_config_t cfg = checked_vsa_config(user_cfg);
  check_qkv(q, k, v);
  check_sequence_blocks("q", q);
  check_sequence_blocks("k", k);
  if (q->shape[kD] != 64 && q->shape[kD] != 128)
    fail(FVA_ERR_UNSUPPORTED, "q: head dim shape[3] = {} is not supported; VSA needs D = 64 or 128",
         q->shape[kD]);
  check_q2k_idx(q2k_idx, q);
  VsaProblem p;
  p.scale = resolve_softmax_scale(cfg.softmax_scale, q->shape[kD]);
  p.dtype = q->dtype;
  p.B = q->shape[kB];
  p.Hq = q->shape[kH];
  p.Hkv = k->shape[kH];
  p.num_q_blocks = q->shape[kS] / kVsaBlock;
  p.num_kv_blocks = k->shape[kS] / kVsaBlock;
  p.max_k = q2k_idx->shape[3];
  p.D = q->shape[kD];
  return p;
}

// q2k_num int32 [B, Hq, num_q_blocks] and block_sizes int32 [num_kv_blocks].
void check_block_metadata(const fva_tensor_t* q2k_num, const fva_tensor_t* block_sizes,
                          const fva_tensor_t* q2k_idx, const VsaProblem& p) {
  check_tensor("q2k_num", q2k_num, 3, kI32Only, false, "[B, H, num_q_blocks]");
  for (int d = 0; d < 3; ++d) check_dim_matches("q2k_num", q2k_num, d, "q2k_idx", q2k_idx, d);
  check_tensor("block_sizes", block_sizes, 1, kI32Only, false, "[num_kv_blocks]");
  check_dim_is("block_sizes", block_sizes, 0, p.num_kv_blocks, "num_kv_blocks = k.shape[2] / 64");
}

// q2k_idx and k2q_idx agree on B, H and the block counts; returns the inversion problem.
VsaIndexProblem checked_index_problem(const fva_tensor_t* q2k_idx, const fva_tensor_t* k2q_idx) {
  check_tensor("q2k_idx", q2k_idx, 4, kI32Only, false, "[B, H, num_q_blocks, max_k]");
  check_tensor("k2q_idx", k2q_idx, 4, kI32Only, true, "[B, H, num_kv_blocks, num_q_blocks]");
  check_dim_matches("k2q_idx", k2q_idx, 0, "q2k_idx", q2k_idx, 0);
  check_dim_matches("k2q_idx", k2q_idx, 1, "q2k_idx", q2k_idx, 1);
  check_dim_matches("k2q_idx", k2q_idx, 3, "q2k_idx", q2k_idx, 2);
  VsaIndexProblem p;
  p.B = q2k_idx->shape[0];
  p.H = q2k_idx->shape[1];
  p.num_q_blocks = q2k_idx->shape[2];
  p.max_k = q2k_idx->shape[3];
  p.num_kv_blocks = k2q_idx->shape[2];
  return p;
}

size_t forward_workspace(const fva_handle& h, const VsaProblem& p) {
  if (h.backend == FVA_BACKEND_CPU) return cpu::vsa_forward_workspace(p);
  cuda::require_vsa_support(p, p.dtype);
  return cuda::vsa_forward_workspace(h, p);
}

size_t backward_workspace(const fva_handle& h, const VsaProblem& p) {
  if (h.backend == FVA_BACKEND_CPU) return cpu::vsa_backward_workspace(p);
  cuda::require_vsa_support(p, p.dtype);
  return cuda::vsa_backward_workspace(h, p);
}

size_t invert_workspace(const fva_handle& h, const VsaIndexProblem& p) {
  return h.backend == FVA_BACKEND_CPU ? cpu::vsa_invert_indices_workspace(p)
                                      : cuda::vsa_invert_indices_workspace(p);
}

}  // namespace
}  // namespace fva

extern "C" {

fva_status_t fva_vsa_forward_workspace_size(fva_handle_t h, const fva_vsa_config_t* cfg,
                                            const fva_tensor_t* q, const fva_tensor_t* k,
                                            const fva_tensor_t* v, const fva_tensor_t* q2k_idx,
                                            size_t* bytes) {
  using namespace fva;
  return workspace_query(
      h, bytes, "fva_vsa_forward_workspace_size", [&] { return checked_vsa_problem(cfg, q, k, v, q2k_idx); },
      forward_workspace);
}

fva_status_t fva_vsa_forward(fva_handle_t h, const fva_vsa_config_t* cfg, const fva_tensor_t* q,
                             const fva_tensor_t* k, const fva_tensor_t* v,
                             const fva_tensor_t* q2k_idx, const fva_tensor_t* q2k_num,
                             const fva_tensor_t* block_sizes, const fva_tensor_t* o,
                             const fva_tensor_t* lse, void* ws, size_t ws_bytes, void* stream) {
  return fva::guard([&] {
    using namespace fva;
    const fva_handle& handle = checked_handle(h);
    const VsaProblem p = checked_vsa_problem(cfg, q, k, v, q2k_idx);
    check_block_metadata(q2k_num, block_sizes, q2k_idx, p);
    check_like("o", o, "q", q, true);
    check_lse(lse, q, true);
    check_no_overlap({{"q", q, false}, {"k", k, false}, {"v", v, false},
                      {"q2k_idx", q2k_idx, false}, {"q2k_num", q2k_num, false},
                      {"block_sizes", block_sizes, false}, {"o", o, true}, {"lse", lse, true}});
    require_backend_support(handle, "fva_vsa_forward");
    check_workspace(ws, ws_bytes, forward_workspace(handle, p), "fva_vsa_forward_workspace_size");
    if (handle.backend == FVA_BACKEND_CUDA) {
      cuda::check_launch_context(handle.device, stream);
      cuda::vsa_forward(handle, p, *q, *k, *v, *q2k_idx, *q2k_num, *block_sizes, *o, *lse, ws, stream);
      return;
    }

    cpu::vsa_forward(p, cpu::AttnView::of(*q), cpu::AttnView::of(*k), cpu::AttnView::of(*v),
                     cpu::I32View::of(*q2k_idx), cpu::I32View::of(*q2k_num),
                     cpu::I32View::of(*block_sizes), cpu::AttnView::of(*o),
                     cpu::F32View::of(*lse), ws, handle.threads);
  });
}

fva_status_t fva_vsa_backward_workspace_size(fva_handle_t h, const fva_vsa_config_t* cfg,
                                             const fva_tensor_t* q, const fva_tensor_t* k,
                                             const fva_tensor_t* v, const fva_tensor_t* q2k_idx,
                                             size_t* bytes) {
  using namespace fva;
  return workspace_query(
      h, bytes, "fva_vsa_backward_workspace_size", [&] { return checked_vsa_problem(cfg, q, k, v, q2k_idx); },
      backward_workspace);
}

fva_status_t fva_vsa_backward(fva_handle_t h, const fva_vsa_config_t* cfg, const fva_tensor_t* q,
                              const fva_tensor_t* k, const fva_tensor_t* v, const fva_tensor_t* o,
                              const fva_tensor_t* lse, const fva_tensor_t* dout,
                              const fva_tensor_t* q2k_idx, const fva_tensor_t* q2k_num,
                              const fva_tensor_t* block_sizes, const fva_tensor_t* dq,
                              const fva_tensor_t* dk, const fva_tensor_t* dv, void* ws,
                              size_t ws_bytes, void* stream) {
  return fva::guard([&] {
    using namespace fva;
    const fva_handle& handle = checked_handle(h);
    const VsaProblem p = checked_vsa_problem(cfg, q, k, v, q2k_idx);
    check_block_metadata(q2k_num, block_sizes, q2k_idx, p);
    check_like("o", o, "q", q, false);
    check_lse(lse, q, false);
    check_like("dout", dout, "q", q, false);
    check_like("dq", dq, "q", q, true);
    check_like("dk", dk, "k", k, true);
    check_like("dv", dv, "v", v, true);
    check_no_overlap({{"q", q, false}, {"k", k, false}, {"v", v, false}, {"o", o, false},
                      {"lse", lse, false}, {"dout", dout, false}, {"q2k_idx", q2k_idx, false},
                      {"q2k_num", q2k_num, false}, {"block_sizes", block_sizes, false},
                      {"dq", dq, true}, {"dk", dk, true}, {"dv", dv, true}});
    require_backend_support(handle, "fva_vsa_backward");
    check_workspace(ws, ws_bytes, backward_workspace(handle, p), "fva_vsa_backward_workspace_size");
    if (handle.backend == FVA_BACKEND_CUDA) {
      cuda::check_launch_context(handle.device, stream);
      cuda::vsa_backward(handle, p, *q, *k, *v, *o, *lse, *dout, *q2k_idx, *q2k_num, *block_sizes,
                         *dq, *dk, *dv, ws, stream);
      return;
    }

    cpu::vsa_backward(p, cpu::AttnView::of(*q), cpu::AttnView::of(*k), cpu::AttnView::of(*v),
                      cpu::AttnView::of(*o), cpu::F32View::of(*lse), cpu::AttnView::of(*dout),
                      cpu::I32View::of(*q2k_idx), cpu::I32View::of(*q2k_num),
                      cpu::I32View::of(*block_sizes), cpu::AttnView::of(*dq),
                      cpu::AttnView::of(*dk), cpu::AttnView::of(*dv), ws, handle.threads);
  });
}

fva_status_t fva_vsa_invert_indices_workspace_size(fva_handle_t h, const fva_tensor_t* q2k_idx,
                                                   const fva_tensor_t* k2q_idx, size_t* bytes) {
  using namespace fva;
  return workspace_query(
      h, bytes, "fva_vsa_invert_indices_workspace_size", [&] { return checked_index_problem(q2k_idx, k2q_idx); },
      invert_workspace);
}

fva_status_t fva_vsa_invert_indices(fva_handle_t h, const fva_tensor_t* q2k_idx,
                                    const fva_tensor_t* q2k_num, const fva_tensor_t* k2q_idx,
                                    const fva_tensor_t* k2q_num, void* ws, size_t ws_bytes,
                                    void* stream) {
  return fva::guard([&] {
    using namespace fva;
    const fva_handle& handle = checked_handle(h);
    const VsaIndexProblem p = checked_index_problem(q2k_idx, k2q_idx);
    check_tensor("q2k_num", q2k_num, 3, kI32Only, false, "[B, H, num_q_blocks]");
    for (int d = 0; d < 3; ++d) check_dim_matches("q2k_num", q2k_num, d, "q2k_idx", q2k_idx, d);
    check_tensor("k2q_num", k2q_num, 3, kI32Only, true, "[B, H, num_kv_blocks]");
    for (int d = 0; d < 3; ++d) check_dim_matches("k2q_num", k2q_num, d, "k2q_idx", k2q_idx, d);
    check_no_overlap({{"q2k_idx", q2k_idx, false}, {"q2k_num", q2k_num, false},
                      {"k2q_idx", k2q_idx, true}, {"k2q_num", k2q_num, true}});
    require_backend_support(handle, "fva_vsa_invert_indices");
    check_workspace(ws, ws_bytes, invert_workspace(handle, p),
                    "fva_vsa_invert_indices_workspace_size");
    if (handle.backend == FVA_BACKEND_CUDA) {
      cuda::check_launch_context(handle.device, stream);
      cuda::vsa_invert_indices(handle, p, *q2k_idx, *q2k_num, *k2q_idx, *k2q_num, ws, stream);
      return;
    }
    cpu::vsa_invert_indices(p, cpu::I32View::of(*q2k_idx), cpu::I32View::of(*q2k_num),
                            cpu::I32View::of(*k2q_idx), cpu::I32View::of(*k2q_num), ws,
                            handle.threads);
  });
}

}  // extern "C"
