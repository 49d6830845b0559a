// CPU reference VSA forward (SPEC.md section 3): for each (batch, q head, q block), an online
// softmax in base 2 over the listed kv blocks in list order, the way FastVideo's Triton kernel
// runs it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "vsa_common.h"

namespace fva::cpu {
namespace {

using namespace vsa;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// fp32 buffers of one q block's computation, carved from one allocation.
struct ForwardScratch {
  std::vector<float> buf;
  float *q, *k, *kt, *v, *s, *acc, *m, *l;

  explicit ForwardScratch(int64_t D)
      : buf(static_cast<size_t>(5 * kBlock * D + kBlock * kBlock + 2 * kBlock)) {
    float* p = buf.data();
    q = p, p += kBlock * D;
    k = p, p += kBlock * D;
    kt = p, p += kBlock * D;
    v = p, p += kBlock * D;
    acc = p, p += kBlock * D;
    s = p, p += kBlock * kBlock;
    m = p, p += kBlock;
    l = p;
  }
};

struct ForwardArgs {
  const VsaProblem& p;
  const AttnView &q, &k, &v;
  const I32View &q2k_idx, &q2k_num, &block_sizes;
  const AttnView& o;
  const F32View& lse;
};

// One row's update with key block scores s[0, n): m' = max(m, rowmax(s)·c), p = 2^(s·c - m'),
// l = l·2^(m - m') + Σp, acc = acc·2^(m - m') + dtype(p)·v.
void update_row(float c, int32_t dtype, int64_t D, int64_t n, float* s, const float* v, float& m,
                float& l, float* acc) {
  float mx = kNegInf;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, s[j]);
  const float m_new = std::max(m, mx * c);  // NaN logits are passed over, as fmaxf does
  // Every scaled logit -inf so far (overflow): p is 2^(-inf - 0) = 0, not 2^(-inf + inf) = NaN. A
  // NaN logit still gives a NaN p, so l and the row's outputs become NaN (SPEC-notes' NaN rule),
  // as on the GPU.
  const float m_use = m_new == kNegInf ? 0.0f : m_new;
  const float alpha = std::exp2(m - m_use);  // m = -inf (first visible block): 0, no NaN
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float pj = std::exp2(s[j] * c - m_use);
    sum += pj;                    // l sums the unrounded p ...
    s[j] = round_to_dtype(dtype, pj);   // ... P·V uses p in the tensor dtype, as the GPU's MMA does
  }
  l = l * alpha + sum;
  m = m_new;
  if (alpha != 1.0f)
    for (int64_t d = 0; d < D; ++d) acc[d] *= alpha;
  accumulate_rows(s, n, v, D, acc);
}

void forward_q_block(const ForwardArgs& a, int64_t b, int64_t hq, int64_t qb, ForwardScratch& w) {
  const VsaProblem& p = a.p;
  const int64_t D = p.D;
  const int64_t hkv = hq / (p.Hq / p.Hkv);
  const int64_t s0 = qb * kBlock;
  const float c = p.scale * kLog2e;
  const int32_t dtype = a.q.dtype;

  load_rows(a.q, b, hq, s0, kBlock, w.q);
  std::fill(w.acc, w.acc + kBlock * D, 0.0f);
  std::fill(w.m, w.m + kBlock, kNegInf);
  std::fill(w.l, w.l + kBlock, 0.0f);

  const int64_t count = list_count(a.q2k_num, b, hq, qb, p.max_k);
  for (int64_t t = 0; t < count; ++t) {
    const int64_t kv = a.q2k_idx.at(b, hq, qb, t);
    if (!kv_in_range(kv, p.num_kv_blocks)) continue;
    const int64_t n = kv_tokens(a.block_sizes, kv);  // keys at slot >= n are masked: never loaded
    if (n == 0) continue;
    load_rows(a.k, b, hkv, kv * kBlock, n, w.k);
    transpose_rows(w.k, n, D, w.kt);
    load_rows(a.v, b, hkv, kv * kBlock, n, w.v);
    score_block(w.q, w.kt, D, n, w.s);
    for (int64_t i = 0; i < kBlock; ++i)
      update_row(c, dtype, D, n, w.s + i * kBlock, w.v, w.m[i], w.l[i], w.acc + i * D);
  }

  for (int64_t i = 0; i < kBlock; ++i) {
    float* acc = w.acc + i * D;
    if (w.l[i] != 0.0f) {  // a NaN l (a NaN or Inf input) gives NaN outputs, not an empty row
      for (int64_t d = 0; d < D; ++d) acc[d] /= w.l[i];
      a.lse.at(b, hq, s0 + i) = w.m[i] + std::log2(w.l[i]);
    } else {
      // No visible key (count 0, every entry skipped, or all keys masked): defined as o = 0,
      // lse = -inf (acc is still all zeros here).
      a.lse.at(b, hq, s0 + i) = kNegInf;
    }
  }
  store_rows(a.o, b, hq, s0, kBlock, w.acc, 1.0f);
}

}  // namespace

// Scratch is per chunk of q blocks, from the heap: its size depends on the thread count, which the
// workspace size may not.
size_t vsa_forward_workspace(const VsaProblem&) { return 0; }

void vsa_forward(const VsaProblem& p, const AttnView& q, const AttnView& k, const AttnView& v,
                 const I32View& q2k_idx, const I32View& q2k_num, const I32View& block_sizes,
                 const AttnView& o, const F32View& lse, void* /*ws*/, int threads) {
  const ForwardArgs args{p, q, k, v, q2k_idx, q2k_num, block_sizes, o, lse};
  const int64_t nqb = p.num_q_blocks;
  parallel_chunks(p.B * p.Hq * nqb, threads, [&](int64_t begin, int64_t end) {
    ForwardScratch w(p.D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t qb = item % nqb;
      const int64_t bh = item / nqb;
      forward_q_block(args, bh / p.Hq, bh % p.Hq, qb, w);
    }
  });
}

}  // namespace fva::cpu
