// The CUDA backend's operations: the same problems as the CPU backend (src/cpu/cpu_ops.h), run by
// the kernels of kernels/ on the caller's stream. The API layer has checked every argument; these
// check what only the CUDA backend limits (head dim, dtype, grid sizes) and throw fva::Failure.
// Nothing here synchronizes: every call can be captured in a CUDA graph.
#pragma once

#include <cstddef>

#include "shared/kernel_params.h"
#include "cpu/cpu_ops.h"
#include "fvattn/fvattn.h"
#include "handle.h"

namespace fva::cuda {

// Throws FVA_ERR_UNSUPPORTED (naming the CPU backend as the alternative) unless the CUDA kernels
// cover this head dim, dtype and size.
void require_qat_support(const cpu::QatProblem& p, int32_t dtype);
void require_vsa_support(const cpu::VsaProblem& p, int32_t dtype);

size_t qat_forward_workspace(const fva_handle& h, const cpu::QatProblem& p);
void qat_forward(const fva_handle& h, const cpu::QatProblem& p, const fva_tensor_t& q,
                 const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& o,
                 const fva_tensor_t* o_hp, const fva_tensor_t& lse, void* ws, void* stream);

// The QAT backward's workspace depends on the handle: on sm_90a a handle that is not deterministic
// reduces dQ in an fp32 accumulator there (sm90_kernels.h, sm90_fuses_dq).
size_t qat_backward_workspace(const fva_handle& h, const cpu::QatProblem& p);
void qat_backward(const fva_handle& h, const cpu::QatProblem& p, const fva_tensor_t& q,
                  const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& o_for_bwd,
                  const fva_tensor_t& lse, const fva_tensor_t& dout, const fva_tensor_t& dq,
                  const fva_tensor_t& dk, const fva_tensor_t& dv, void* ws, void* stream);

void nvfp4_fake_quantize(const fva_handle& h, const cpu::Nvfp4Problem& p, const fva_tensor_t& x,
                         const fva_tensor_t& y, void* stream);

size_t vsa_forward_workspace(const cpu::VsaProblem& p);
void vsa_forward(const fva_handle& h, const cpu::VsaProblem& p, const fva_tensor_t& q,
                 const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& q2k_idx,
                 const fva_tensor_t& q2k_num, const fva_tensor_t& block_sizes,
                 const fva_tensor_t& o, const fva_tensor_t& lse, void* ws, void* stream);

// The VSA backward's workspace depends on the handle: on sm_90a the dK/dV kernel stores every
// listed pair's dS tile there for the dQ kernel (8 KiB a pair, in chunks of at most
// FVATTN_DS_BUDGET_MIB, default 2048; sm90_kernels.h, sm90_ds_chunks).
size_t vsa_backward_workspace(const fva_handle& h, const cpu::VsaProblem& p);
void vsa_backward(const fva_handle& h, const cpu::VsaProblem& p, const fva_tensor_t& q,
                  const fva_tensor_t& k, const fva_tensor_t& v, const fva_tensor_t& o,
                  const fva_tensor_t& lse, const fva_tensor_t& dout, const fva_tensor_t& q2k_idx,
                  const fva_tensor_t& q2k_num, const fva_tensor_t& block_sizes,
                  const fva_tensor_t& dq, const fva_tensor_t& dk, const fva_tensor_t& dv, void* ws,
                  void* stream);

// Delta = rowsum(o_for_bwd * dO) into a.delta, the pre-pass of both backwards (a.D's kernel), a
// row group per warp, or with max_blocks > 0 at most that many blocks striding over the rows.
// Returns the grid's block count (what a.delta_done, when set, counts up to).
unsigned launch_delta(const fva_handle& h, const kern::AttentionParams& a, int64_t D, int32_t dtype,
                      void* stream, unsigned max_blocks = 0);

size_t vsa_invert_indices_workspace(const cpu::VsaIndexProblem& p);
void vsa_invert_indices(const fva_handle& h, const cpu::VsaIndexProblem& p,
                        const fva_tensor_t& q2k_idx, const fva_tensor_t& q2k_num,
                        const fva_tensor_t& k2q_idx, const fva_tensor_t& k2q_num, void* ws,
                        void* stream);

}  // namespace fva::cuda
