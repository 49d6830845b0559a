// Kernel parameter blocks (kernels/shared/kernel_params.h) from the API's tensor descriptors, and
// the limits every CUDA kernel shares.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shared/kernel_params.h"
#include "error.h"
#include "fvattn/fvattn.h"

namespace fva::cuda {

inline kern::Tensor4 tensor4(const fva_tensor_t& t) {
  return {t.data, t.strides[0], t.strides[1], t.strides[2]};
}
inline kern::Tensor3 tensor3(const fva_tensor_t& t) {
  return {static_cast<float*>(t.data), t.strides[0], t.strides[1], t.strides[2]};
}
// A contiguous [B, H, S, D] buffer.
inline kern::Tensor4 contiguous4(void* data, int64_t H, int64_t S, int64_t D) {
  return {data, H * S * D, S * D, D};
}

// The backward's own tensors (both ops): the output its Delta reads, dO, lse, the gradients, and
// Delta's buffer in the workspace.
inline void set_backward_tensors(kern::AttentionParams& a, const fva_tensor_t& o_for_bwd,
                                 const fva_tensor_t& dout, const fva_tensor_t& lse,
                                 const fva_tensor_t& dq, const fva_tensor_t& dk,
                                 const fva_tensor_t& dv, float* delta) {
  a.o_for_bwd = tensor4(o_for_bwd);
  a.dout = tensor4(dout);
  a.lse = tensor3(lse);
  a.dq = tensor4(dq);
  a.dk = tensor4(dk);
  a.dv = tensor4(dv);
  a.delta = delta;
}

inline unsigned blocks_for(int64_t items, int64_t per_block) {
  return static_cast<unsigned>((items + per_block - 1) / per_block);
}

// The kernels are instantiated for bf16 and fp16 only (FVA_ERR_UNSUPPORTED otherwise).
inline void require_kernel_dtype(int32_t dtype, const char* arg) {
  if (dtype != FVA_DTYPE_BF16 && dtype != FVA_DTYPE_F16)
    fail(FVA_ERR_UNSUPPORTED, "{}: the CUDA backend runs bf16 and f16 only", arg);
}

// What every attention kernel instantiation covers: D = 64 or 128, bf16/f16, and at most 65535
// (batch, head) pairs per launch (the grid's y dimension). FVA_ERR_UNSUPPORTED otherwise.
inline void require_attention_kernels(int64_t D, int32_t dtype, int64_t batch_heads) {
  if (D != 64 && D != 128)
    fail(FVA_ERR_UNSUPPORTED,
         "q: head dim {} is not supported by the CUDA backend (its kernels cover D = 64 and 128); "
         "the CPU backend (FVA_BACKEND_CPU, host pointers) runs it",
         D);
  require_kernel_dtype(dtype, "q");
  if (batch_heads > 65535)
    fail(FVA_ERR_UNSUPPORTED,
         "q: B * H = {} exceeds the CUDA backend's limit of 65535 (batch x heads per launch)",
         batch_heads);
}

inline const char* dtype_suffix(int32_t dtype) { return dtype == FVA_DTYPE_F16 ? "f16" : "bf16"; }

}  // namespace fva::cuda
