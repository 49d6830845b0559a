// The epilogue of both sm_90a dQ kernels (sm90/attention_dq.cuh, sm90/attention_dq_from_ds.cuh):
// dQ of a thread's two rows from its dS K accumulator and its part of rowsum(dS).
#pragma once

#include "shared/kernel_params.h"
#include "primitives/block_terms.cuh"
#include "primitives/sm80.cuh"

namespace fva::dev::sm90 {

// dQ = scale (dS K + rowsum(dS) mean(k)) of a thread's two rows, each with its block's term when the
// VSA layer gives them (p.terms); rows past Sq are not written, and nothing is when the layer's
// record disagrees (check).
template <typename T, int D>
__device__ __forceinline__ void store_dq(const kern::AttentionParams& p, const RecordCheck& check,
                                         int b, int h, int row_base,
                                         int t, const float (&dq)[D / 2],
                                         const float (&ds_sum)[2]) {
  using E = typename T::Storage;
  const float rowsum[2] = {quad_sum(ds_sum[0]), quad_sum(ds_sum[1])};
  await_block_terms(p);
  if (!check.passes(p)) return;  // the VSA layer's record disagrees: write nothing
  E* dqg = static_cast<E*>(p.dq.data) + b * p.dq.stride_b + h * p.dq.stride_h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_base + 8 * r;
    if (row >= p.Sq) continue;
    const RowTerms<T, D> term(p.terms.dq, static_cast<int64_t>(b) * p.Hq + h, p.vsa.num_q_blocks,
                              row, t);
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int col = j * 8 + 2 * t;
      float x0 = dq[4 * j + 2 * r], x1 = dq[4 * j + 2 * r + 1];
      if (p.k_mean != nullptr) {
        x0 += rowsum[r] * p.k_mean[col];
        x1 += rowsum[r] * p.k_mean[col + 1];
      }
      *reinterpret_cast<uint32_t*>(dqg + row * p.dq.stride_s + col) =
          term.pack(p.scale * x0, p.scale * x1, j);
    }
  }
}

}  // namespace fva::dev::sm90
