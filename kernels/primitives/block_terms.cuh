// The VSA layer's record check and block terms in the kernels that write dq, dk and dv
// (kern::BlockTerms in shared/kernel_params.h): the layer's backward has the fine branch's kernels
// add each 64-token block's term to its rows, so that no later pass reads and rewrites the three
// gradients.
#pragma once

#include <stdint.h>

#include "primitives/sm80.cuh"
#include "shared/kernel_params.h"

namespace fva::dev {

// Whether the reserve's record is the one this call expects, decided by each warp on its own (every
// lane of the warp must call it, converged): lane w < 20 compares word w.
__device__ __forceinline__ bool reserve_matches(const kern::LayerReserveCheck& c) {
  const int lane = threadIdx.x & 31;
  const uint32_t* stored = reinterpret_cast<const uint32_t*>(c.stored);
  const uint32_t* expected = reinterpret_cast<const uint32_t*>(&c.expected);
  bool ok = true;
#pragma unroll
  for (int w = 0; w < kern::kLayerHeaderWords; ++w)
    if (lane == w) ok = stored[w] == expected[w];
  return __all_sync(0xffffffffu, ok);
}

// At the entry of a kernel that writes dq, dk or dv, by every thread: false when the layer's record
// disagrees with the call (the kernel then returns before writing anything). Every warp reads the
// same record, so the whole block (and cluster) decides alike.
__device__ __forceinline__ bool may_write_gradients(const kern::AttentionParams& p) {
  return p.terms.check.stored == nullptr || reserve_matches(p.terms.check);
}

// One output row's block term: pack(x0, x1, col) is the pair at columns col, col + 1 of the row,
// dtype(dtype(x) + term) with a term, dtype(x) without.
template <typename T>
struct RowTerm {
  const typename T::Storage* row;  // null: no term
  __device__ __forceinline__ uint32_t pack(float x0, float x1, int col) const {
    if (row == nullptr) return T::pack(x0, x1);
    const uint32_t t = *reinterpret_cast<const uint32_t*>(row + col);
    return T::pack(T::round(x0) + T::low(t), T::round(x1) + T::high(t));
  }
};

// The term of row s of head unit (b * H + h), whose 64-token blocks number nblocks, in terms
// ([B, H, nblocks, D], contiguous; null: none).
template <typename T, int D>
__device__ __forceinline__ RowTerm<T> row_term(const void* terms, int64_t unit, int64_t nblocks,
                                               int64_t s) {
  if (terms == nullptr) return {nullptr};
  return {static_cast<const typename T::Storage*>(terms) + (unit * nblocks + s / 64) * D};
}

}  // namespace fva::dev
