// The CUDA backend's operations: the same problems as the CPU backend (core/problems.h), run by
// the kernels of kernels/ on the caller's stream. The API layer has checked every argument; these
// check what only the CUDA backend limits (head dim, dtype, grid sizes) and throw fva::Failure.
// Nothing here synchronizes: every call can be captured in a CUDA graph. The API layer has also made
// the device's context current and checked the stream (stream_check.h) before any of these runs.
#pragma once

#include <cstddef>
#include <functional>

#include "shared/kernel_params.h"
#include "core/problems.h"
#include "fvattn/fvattn.h"
#include "handle.h"

namespace fva::cuda {

// Throws FVA_ERR_UNSUPPORTED (naming the CPU backend as the alternative) unless the CUDA kernels
// cover this head dim, dtype and size.
void require_qat_support(const QatProblem& p, int32_t dtype);
void require_vsa_support(const VsaProblem& p, int32_t dtype);

size_t qat_forward_workspace(const fva_handle& h, const QatProblem& p);
void qat_forward(const fva_handle& h, const QatProblem& p, const fva_tensor_t& q,
                 const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& o,
                 const fva_tensor_t* o_hp, const fva_tensor_t& lse, void* ws, void* stream);

// The workspace sizes are those of the operation's plan (qat_plan.h, vsa_plan.h): they depend on the
// handle (device, options), the config and the shapes alone.
size_t qat_backward_workspace(const fva_handle& h, const QatProblem& p);
void qat_backward(const fva_handle& h, const QatProblem& p, const fva_tensor_t& q,
                  const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& o_for_bwd,
                  const fva_tensor_t& lse, const fva_tensor_t& dout, const fva_tensor_t& dq,
                  const fva_tensor_t& dk, const fva_tensor_t& dv, void* ws, void* stream);

void nvfp4_fake_quantize(const fva_handle& h, const Nvfp4Problem& p, const fva_tensor_t& x,
                         const fva_tensor_t& y, void* stream);

size_t vsa_forward_workspace(const fva_handle& h, const VsaProblem& p);
// layer_gate (the VSA layer's forward; null for fva_vsa_forward): the layer's output pass, which
// the sm_90a kernel runs in its epilogue (kern::Sm90FusedLayerGate). Returns whether it ran; if
// not (the portable kernels, or a gate or out the TMA cannot map), the caller runs the pass on its
// own.
bool vsa_forward(const fva_handle& h, const VsaProblem& p, const fva_tensor_t& q,
                 const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& q2k_idx,
                 const fva_tensor_t& q2k_num, const fva_tensor_t& block_sizes,
                 const fva_tensor_t& o, const fva_tensor_t& lse, void* ws, void* stream,
                 const kern::Sm90FusedLayerGate* layer_gate = nullptr);

// The VSA backward's workspace depends on the handle: on sm_90a the dK/dV kernel stores every
// listed pair's dS tile there for the dQ kernel (8 KiB a pair, in chunks of at most the handle's
// ds_budget_mib; vsa_plan.h). terms (the VSA layer's backward; null for fva_vsa_backward): the
// block means' terms its kernels add to every row of dq, dk and dv, and the reserve record they
// check before writing (kern::BlockTerms).
//
// delta_written: Delta = rowsum(o * dout) is already in ws's Delta region (vsa_backward_delta,
// fp32 [B, Hq, Sq]), written by a kernel earlier in the call's launch chain (the VSA layer's gate
// pass, which reads dout anyway), with the bits the Delta kernel computes; the backward then runs
// no Delta of its own. before_gradients (not null): launches kernels that the caller chains after
// the k2q inverse and before the kernels that write dq, dk and dv (the VSA layer's gate pass and
// coarse backward, which then run beside the inverse's last kernel, the inverse's latency hidden
// under the gate's pass over memory); with delta_written, one of them may be what writes Delta.
size_t vsa_backward_workspace(const fva_handle& h, const VsaProblem& p);
float* vsa_backward_delta(const fva_handle& h, const VsaProblem& p, void* ws);
void vsa_backward(const fva_handle& h, const VsaProblem& p, const fva_tensor_t& q,
                  const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& o,
                  const fva_tensor_t& lse, const fva_tensor_t& dout, const fva_tensor_t& q2k_idx,
                  const fva_tensor_t& q2k_num, const fva_tensor_t& block_sizes,
                  const fva_tensor_t& dq, const fva_tensor_t& dk, const fva_tensor_t& dv, void* ws,
                  void* stream, const kern::BlockTerms* terms = nullptr,
                  bool delta_written = false,
                  const std::function<void()>* before_gradients = nullptr);

// Delta = rowsum(o_for_bwd * dO) into a.delta, the pre-pass of both backwards (a.D's kernel), a
// row group per warp, or with max_blocks > 0 at most that many blocks striding over the rows.
// Returns the grid's block count (what a.delta_done, when set, counts up to).
unsigned launch_delta(const fva_handle& h, const kern::AttentionParams& a, int64_t D, int32_t dtype,
                      void* stream, unsigned max_blocks = 0);

size_t vsa_invert_indices_workspace(const VsaIndexProblem& p);
void vsa_invert_indices(const fva_handle& h, const VsaIndexProblem& p,
                        const fva_tensor_t& q2k_idx, const fva_tensor_t& q2k_num,
                        const fva_tensor_t& k2q_idx, const fva_tensor_t& k2q_num, void* ws,
                        void* stream);

// The whole VSA layer (SPEC section 3b; vsa_layer_ops.cpp). Its sizes are those of its plan: the
// workspace both calls need (one query, one buffer) and the reserve the forward fills for the
// backward, from the handle and the shapes alone (not the gate).
struct VsaLayerSizes {
  size_t workspace = 0, reserve = 0;
};
void require_vsa_layer_support(const VsaLayerProblem& p, int32_t dtype);
VsaLayerSizes vsa_layer_sizes(const fva_handle& h, const VsaLayerProblem& p);
// gate null: no gate; q2k_idx and q2k_num null: the selection is not copied out.
void vsa_layer_forward(const fva_handle& h, const VsaLayerProblem& p, const fva_tensor_t& q,
                       const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t* gate,
                       const fva_tensor_t& q_block_sizes, const fva_tensor_t& kv_block_sizes,
                       const fva_tensor_t& out, const fva_tensor_t* q2k_idx,
                       const fva_tensor_t* q2k_num, void* reserve, void* ws, void* stream);
// gate and dgate both null or both set.
void vsa_layer_backward(const fva_handle& h, const VsaLayerProblem& p, const fva_tensor_t& q,
                        const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t* gate,
                        const fva_tensor_t& q_block_sizes, const fva_tensor_t& kv_block_sizes,
                        const fva_tensor_t& dout, const void* reserve, const fva_tensor_t& dq,
                        const fva_tensor_t& dk, const fva_tensor_t& dv, const fva_tensor_t* dgate,
                        void* ws, void* stream);

}  // namespace fva::cuda
