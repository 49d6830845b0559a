// The CPU reference backend's operations (SPEC.md, all of it). The API layer (src/api_*.cpp) checks
// every argument and resolves defaults before calling these; they assume valid input and may throw
// std::bad_alloc, which the API layer turns into FVA_ERR_OUT_OF_MEMORY.
//
// Each operation has a workspace function giving the bytes of host scratch it expects in `ws` (the
// caller's workspace, 64-byte aligned by the API layer's contract of 16 plus the op's own padding).
// Work runs on up to `threads` threads over independent (batch, head) units; results do not depend on
// the thread count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/problems.h"
#include "views.h"

namespace fva::cpu {

// NVFP4 fake quantization of a whole [B, H, S, D] tensor along D; y may be x (in place).
void nvfp4_fake_quantize(const Nvfp4Problem& p, const AttnView& x, const AttnView& y, int threads);

size_t qat_forward_workspace(const QatProblem& p);
// Writes o, lse and, when o_hp is not null, o_hp (only when cfg.high_precision_o).
void qat_forward(const QatProblem& p, const AttnView& q, const AttnView& k, const AttnView& v,
                 const AttnView& o, const AttnView* o_hp, const F32View& lse, void* ws,
                 int threads);

size_t qat_backward_workspace(const QatProblem& p);
void qat_backward(const QatProblem& p, const AttnView& q, const AttnView& k, const AttnView& v,
                  const AttnView& o_for_bwd, const F32View& lse, const AttnView& dout,
                  const AttnView& dq, const AttnView& dk, const AttnView& dv, void* ws,
                  int threads);

size_t vsa_forward_workspace(const VsaProblem& p);
void vsa_forward(const VsaProblem& p, const AttnView& q, const AttnView& k, const AttnView& v,
                 const I32View& q2k_idx, const I32View& q2k_num, const I32View& block_sizes,
                 const AttnView& o, const F32View& lse, void* ws, int threads);

size_t vsa_backward_workspace(const VsaProblem& p);
void vsa_backward(const VsaProblem& p, const AttnView& q, const AttnView& k, const AttnView& v,
                  const AttnView& o, const F32View& lse, const AttnView& dout,
                  const I32View& q2k_idx, const I32View& q2k_num, const I32View& block_sizes,
                  const AttnView& dq, const AttnView& dk, const AttnView& dv, void* ws,
                  int threads);

// The whole VSA layer (SPEC section 3b). The reserve is host memory laid out as
// vsa_layer_reserve.h says; its bytes and the workspace both calls need come from the problem alone
// (p.gate is not read).
size_t vsa_layer_reserve_bytes(const VsaLayerProblem& p);
size_t vsa_layer_workspace(const VsaLayerProblem& p);
// Throws fva::Failure (FVA_ERR_INVALID_ARGUMENT, naming the mismatch) unless `reserve` holds the
// record of a forward of exactly p (shapes, dtype, scale, topk, gate). Reads the record only.
void check_vsa_layer_reserve(const VsaLayerProblem& p, const void* reserve);
// gate null: no gate. q2k_idx and q2k_num null: the selection is not copied out.
void vsa_layer_forward(const VsaLayerProblem& p, const AttnView& q, const AttnView& k,
                       const AttnView& v, const AttnView* gate, const I32View& q_block_sizes,
                       const I32View& kv_block_sizes, const AttnView& out, const I32View* q2k_idx,
                       const I32View* q2k_num, void* reserve, void* ws, int threads);
// gate and dgate both null or both set; the reserve has passed check_vsa_layer_reserve.
void vsa_layer_backward(const VsaLayerProblem& p, const AttnView& q, const AttnView& k,
                        const AttnView& v, const AttnView* gate, const I32View& q_block_sizes,
                        const I32View& kv_block_sizes, const AttnView& dout, const void* reserve,
                        const AttnView& dq, const AttnView& dk, const AttnView& dv,
                        const AttnView* dgate, void* ws, int threads);

// Inversion of the q2k lists.
size_t vsa_invert_indices_workspace(const VsaIndexProblem& p);
void vsa_invert_indices(const VsaIndexProblem& p, const I32View& q2k_idx, const I32View& q2k_num,
                        const I32View& k2q_idx, const I32View& k2q_num, void* ws, int threads);

}  // namespace fva::cpu
