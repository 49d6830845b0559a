// Between the tests' host tensors and the float64 reference (tools/reference64): a [B, H, S, D]
// HostTensor's exact values as a reference tensor, and the reference's dtype of an fvattn dtype.
#pragma once

#include <fvattn/fvattn.h>

#include <cstdint>

#include "reference64.h"
#include "support/host_tensor.h"

namespace fvt {

inline ref64::Tensor to_ref(const HostTensor& t) {
  const auto& s = t.shape();
  ref64::Tensor r(ref64::Shape{s[0], s[1], s[2], s[3]});
  r.data = t.values();
  return r;
}

// bf16 or f16 (the dtypes the reference rounds to).
inline ref64::DType ref_dtype(int32_t dt) {
  return dt == FVA_DTYPE_BF16 ? ref64::DType::BF16 : ref64::DType::F16;
}

}  // namespace fvt
