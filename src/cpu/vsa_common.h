// Pieces shared by the CPU reference VSA operations (SPEC.md section 3): the metadata rules that
// keep every read in bounds whatever the caller's indices hold, fp32 staging of 64-token blocks,
// the block products, and the chunked parallel loop.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cpu_ops.h"
#include "parallel.h"
#include "views.h"
#include "core/workspace.h"

namespace fva::cpu::vsa {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int64_t kBlock = kVsaBlock;

// ---- metadata rules (the GPU backend applies the same: neither reads out of bounds) ------------

// Entries of a q2k list that are read: q2k_num clamped to [0, max_k].
inline int64_t list_count(const I32View& q2k_num, int64_t b, int64_t h, int64_t qb, int64_t max_k) {
  const int64_t n = q2k_num.at(b, h, qb);
  return std::min<int64_t>(std::max<int64_t>(n, 0), max_k);
}

// An entry outside [0, num_kv_blocks) is skipped.
inline bool kv_in_range(int64_t kv, int64_t num_kv_blocks) { return kv >= 0 && kv < num_kv_blocks; }

// Real tokens of kv block `kv` (its first slots), clamped to [0, 64].
inline int64_t kv_tokens(const I32View& block_sizes, int64_t kv) {
  return std::min<int64_t>(std::max<int64_t>(block_sizes.at(kv), 0), kBlock);
}

// ---- fp32 staging and block products ----------------------------------------------------------

// `rows` tokens of x from token s0 into row-major fp32 [rows x D].
inline void load_rows(const AttnView& x, int64_t b, int64_t h, int64_t s0, int64_t rows,
                      float* out) {
  for (int64_t r = 0; r < rows; ++r) x.load_row(b, h, s0 + r, out + r * x.shape[3]);
}

// Row-major [rows x D] to [D x kBlock] (column r of the result = row r of the input). Keys and
// values are kept transposed so that score_block's inner loop runs over contiguous keys.
inline void transpose_rows(const float* in, int64_t rows, int64_t D, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < D; ++d) out[d * kBlock + r] = in[r * D + d];
}

// `rows` tokens of x from token s0 <- mul * in (row-major [rows x D]), rounded to the dtype.
inline void store_rows(const AttnView& x, int64_t b, int64_t h, int64_t s0, int64_t rows,
                       const float* in, float mul) {
  for (int64_t r = 0; r < rows; ++r) x.store_row(b, h, s0 + r, in + r * x.shape[3], mul);
}

// S = A·Kᵀ for a block of kBlock rows: s[i * kBlock + j] = a_i·k_j for j < n, with A row-major
// [kBlock x D] and kt = Kᵀ laid out [D x kBlock]. fp32, each element summed over d in ascending
// order. Written as axpy's over the keys (not dot products) so the compiler vectorizes it without
// reassociating a sum, four rows at a time so each load of kt serves four rows.
inline void score_block(const float* __restrict a, const float* __restrict kt, int64_t D, int64_t n,
                        float* __restrict s) {
  static_assert(kBlock % 4 == 0, "rows are taken four at a time");
  for (int64_t i = 0; i < kBlock; i += 4) {
    float* __restrict s0 = s + i * kBlock;
    float* __restrict s1 = s0 + kBlock;
    float* __restrict s2 = s1 + kBlock;
    float* __restrict s3 = s2 + kBlock;
    for (int64_t j = 0; j < n; ++j) s0[j] = s1[j] = s2[j] = s3[j] = 0.0f;
    const float* a0 = a + i * D;
    for (int64_t d = 0; d < D; ++d) {
      const float x0 = a0[d], x1 = a0[D + d], x2 = a0[2 * D + d], x3 = a0[3 * D + d];
      const float* kd = kt + d * kBlock;
      for (int64_t j = 0; j < n; ++j) {
        const float kj = kd[j];
        s0[j] += x0 * kj;
        s1[j] += x1 * kj;
        s2[j] += x2 * kj;
        s3[j] += x3 * kj;
      }
    }
  }
}

// y[0, D) += Σ_j w[j]·x_j for j in [0, n) ascending, with x row-major [n x D]. Four rows per
// pass keep y in registers longer; each y[d] still adds the terms one by one in j order, so the
// result is bitwise that of n separate axpy's.
inline void accumulate_rows(const float* __restrict w, int64_t n, const float* __restrict x,
                            int64_t D, float* __restrict y) {
  const int64_t n4 = n - n % 4;
  for (int64_t j = 0; j < n4; j += 4) {
    const float w0 = w[j], w1 = w[j + 1], w2 = w[j + 2], w3 = w[j + 3];
    const float* x0 = x + j * D;
    const float* x1 = x0 + D;
    const float* x2 = x1 + D;
    const float* x3 = x2 + D;
    for (int64_t d = 0; d < D; ++d) {
      float t = y[d];
      t += w0 * x0[d];
      t += w1 * x1[d];
      t += w2 * x2[d];
      t += w3 * x3[d];
      y[d] = t;
    }
  }
  for (int64_t j = n4; j < n; ++j) {
    const float wj = w[j];
    const float* xj = x + j * D;
    for (int64_t d = 0; d < D; ++d) y[d] += wj * xj[d];
  }
}

// ---- parallel loop and workspace ---------------------------------------------------------------

// body(begin, end) over [0, n) cut into a few chunks per thread, handed out dynamically. Every item
// is computed on its own, in a fixed order, so how items fall into chunks (which depends on the
// thread count) never changes a result; chunks exist so each allocates its fp32 scratch once.
template <typename Body>
void parallel_chunks(int64_t n, int threads, const Body& body) {
  if (n <= 0) return;
  const int64_t target = std::max<int64_t>(1, static_cast<int64_t>(std::max(threads, 1)) * 8);
  const int64_t per = (n + target - 1) / target;
  const int64_t chunks = (n + per - 1) / per;
  parallel_for(chunks, threads, [&](int64_t c) { body(c * per, std::min(n, (c + 1) * per)); });
}

}  // namespace fva::cpu::vsa
