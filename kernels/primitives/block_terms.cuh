// The VSA layer's record check and block terms in the kernels that write dq, dk and dv
// (kern::BlockTerms in shared/kernel_params.h): the layer's backward has the fine branch's kernels
// add each 64-token block's term to its rows, so that no later pass reads and rewrites the three
// gradients.
#pragma once

#include <stdint.h>

#include "primitives/kernel_chain.cuh"
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

// The record check of a kernel that writes dq, dk or dv, in two halves so that its load's latency
// hides under the kernel's work: load() at the kernel's start (lane w < 20 loads word w of the
// stored record), passes() right before the stores (every lane of the warp, converged): false when
// the layer's record disagrees with the call, and the warp then writes nothing. Every warp reads the
// same record, so every warp of the launch decides alike. Without a record to check (the VSA
// backward alone), passes() is true and load() reads nothing.
struct RecordCheck {
  uint32_t word = 0;
  __device__ __forceinline__ static RecordCheck load(const kern::AttentionParams& p) {
    RecordCheck c;
    const int lane = threadIdx.x & 31;
    if (p.terms.check.stored != nullptr && lane < kern::kLayerHeaderWords)
      c.word = reinterpret_cast<const uint32_t*>(p.terms.check.stored)[lane];
    return c;
  }
  __device__ __forceinline__ bool passes(const kern::AttentionParams& p) const {
    if (p.terms.check.stored == nullptr) return true;
    const int lane = threadIdx.x & 31;
    const uint32_t* expected = reinterpret_cast<const uint32_t*>(&p.terms.check.expected);
    bool ok = true;
#pragma unroll
    for (int w = 0; w < kern::kLayerHeaderWords; ++w)
      if (lane == w) ok = word == expected[w];
    return __all_sync(0xffffffffu, ok);
  }
};

// At the start of an epilogue that may add the block terms, before its record check: where the
// kernel runs beside the kernels that write the terms (kern::BlockTerms::written_beside), it waits
// for them here. Every thread that stores reaches it, so the kernel completes after them.
__device__ __forceinline__ void await_block_terms(const kern::AttentionParams& p) {
  if (p.terms.written_beside != 0) wait_for_prior_kernels();
}

// The block terms of one output row at a thread's columns 8j + 2t + {0, 1} (j < D / 8: the MMA
// accumulator layout of every kernel that writes dq, dk or dv), loaded together before the row's
// stores. They load from the L2: the kernels that write the terms may have run while this kernel
// did (await_block_terms). pack(x0, x1, j) is the pair at columns 8j + 2t + {0, 1}:
// dtype(dtype(x) + term) with terms, dtype(x) without.
template <typename T, int D>
struct RowTerms {
  uint32_t w[D / 8];
  bool on;
  // Row s of head unit (b * H + h), whose 64-token blocks number nblocks, in terms ([B, H, nblocks,
  // D], contiguous; null: none).
  __device__ __forceinline__ RowTerms(const void* terms, int64_t unit, int64_t nblocks, int64_t s,
                                      int t)
      : on(terms != nullptr) {
    if (!on) return;
    const unsigned int* row = reinterpret_cast<const unsigned int*>(
        static_cast<const typename T::Storage*>(terms) + (unit * nblocks + s / 64) * D + 2 * t);
#pragma unroll
    for (int j = 0; j < D / 8; ++j) w[j] = __ldcg(row + 4 * j);
  }
  __device__ __forceinline__ uint32_t pack(float x0, float x1, int j) const {
    if (!on) return T::pack(x0, x1);
    return T::pack(T::round(x0) + T::low(w[j]), T::round(x1) + T::high(w[j]));
  }
};

}  // namespace fva::dev
