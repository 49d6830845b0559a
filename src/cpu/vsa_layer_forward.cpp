// CPU reference of the whole VSA layer's forward (SPEC.md section 3b), rounded where FastVideo's
// torch code rounds:
//   1. block means q_c, k_c, v_c: fp32 sums of each block's real slots times the fp32 reciprocal of
//      its size, in the I/O dtype (0 for a block of size 0);
//   2. coarse attention per (batch, q head): scores = dtype(dtype(q_c·k_cᵀ) * scale), attn =
//      dtype(softmax(scores)) in fp32 over the kv blocks of nonzero size (the others get weight 0),
//      out_c = dtype(attn·v_c); and the selection: the topk kv blocks of nonzero size with the
//      highest scores (ties: the lower index), ascending;
//   3. the fine branch: vsa_forward over those lists (out_s, lse_s);
//   4. out = dtype(dtype(out_c[block] * gate) + out_s) (torch's two roundings), or
//      dtype(out_c[block] + out_s) without a gate.
// Everything but out (and the optional copy of the lists) goes to the reserve for the backward. The
// small coarse products accumulate in double before their one rounding: the closest to any fp32
// summation order. Each phase runs over independent (batch, head) items, so the result does not
// depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_ops.h"
#include "vsa_layer_common.h"

namespace fva::cpu {
namespace {

using namespace vsa_layer;

struct ForwardArgs {
  const VsaLayerProblem& p;
  const AttnView &q, &k, &v;
  const AttnView* gate;
  const I32View &q_sizes, &kv_sizes;
  const AttnView& out;
  const Reserve& r;
};

// Block means of head (b, h) of x into `means` ([B, H, n, D] in the reserve).
void block_means(const AttnView& x, int64_t b, int64_t h, int64_t n, const I32View& sizes,
                 const AttnView& means) {
  const int64_t D = x.shape[3];
  std::vector<float> row(static_cast<size_t>(D)), mean(static_cast<size_t>(D));
  std::vector<double> sum(static_cast<size_t>(D));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t tokens = block_tokens(sizes, i);
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t t = 0; t < tokens; ++t) {
      x.load_row(b, h, i * kBlock + t, row.data());
      for (int64_t d = 0; d < D; ++d) sum[d] += row[d];
    }
    const float inv = tokens > 0 ? inverse_size(tokens) : 0.0f;
    for (int64_t d = 0; d < D; ++d) mean[d] = tokens > 0 ? static_cast<float>(sum[d]) * inv : 0.0f;
    means.store_row(b, h, i, mean.data());
  }
}

// True when kv block a ranks before kv block b: the higher score first, a NaN score after every
// number, ties to the lower index. A strict total order, so the selection is well defined whatever
// the scores hold.
bool ranks_before(const float* score, int32_t a, int32_t b) {
  const float sa = score[a], sb = score[b];
  const bool na = std::isnan(sa), nb = std::isnan(sb);
  if (na != nb) return nb;
  if (!na && sa != sb) return sa > sb;
  return a < b;
}

// The coarse attention and the selection of one (batch, q head).
void coarse_head(const ForwardArgs& a, int64_t b, int64_t hq) {
  const VsaProblem& f = a.p.fine;
  const int64_t D = f.D, nq = f.num_q_blocks, nkv = f.num_kv_blocks;
  const int64_t hkv = hq / (f.Hq / f.Hkv);
  const int32_t dtype = f.dtype;
  std::vector<float> qc(static_cast<size_t>(nq * D)), kc(static_cast<size_t>(nkv * D)),
      vc(static_cast<size_t>(nkv * D)), score(static_cast<size_t>(nkv)),
      weight(static_cast<size_t>(nkv)), row(static_cast<size_t>(D));
  std::vector<double> acc(static_cast<size_t>(D));
  std::vector<int32_t> included;
  for (int64_t j = 0; j < nkv; ++j)
    if (block_tokens(a.kv_sizes, j) > 0) included.push_back(static_cast<int32_t>(j));
  vsa::load_rows(a.r.q_c, b, hq, 0, nq, qc.data());
  vsa::load_rows(a.r.k_c, b, hkv, 0, nkv, kc.data());
  vsa::load_rows(a.r.v_c, b, hkv, 0, nkv, vc.data());
  const int64_t k = std::min<int64_t>(a.p.topk, static_cast<int64_t>(included.size()));
  std::vector<int32_t> order;

  for (int64_t i = 0; i < nq; ++i) {
    const float* qi = qc.data() + i * D;
    // scores, over the included kv blocks only
    float mx = -INFINITY;
    for (int32_t j : included) {
      double dot = 0.0;
      const float* kj = kc.data() + j * D;
      for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qi[d]) * kj[d];
      score[j] = round_to_dtype(dtype, round_to_dtype(dtype, static_cast<float>(dot)) * f.scale);
      mx = std::max(mx, score[j]);
    }
    // softmax in fp32, rounded to the dtype; excluded blocks weigh 0
    std::fill(weight.begin(), weight.end(), 0.0f);
    float total = 0.0f;
    for (int32_t j : included) total += weight[j] = std::exp(score[j] - mx);
    for (int32_t j : included) weight[j] = round_to_dtype(dtype, weight[j] / total);
    a.r.attn.store_row(b, hq, i, weight.data());
    // out_c = attn·v_c
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int32_t j : included) {
      const float* vj = vc.data() + j * D;
      for (int64_t d = 0; d < D; ++d) acc[d] += static_cast<double>(weight[j]) * vj[d];
    }
    for (int64_t d = 0; d < D; ++d) row[d] = static_cast<float>(acc[d]);
    a.r.out_c.store_row(b, hq, i, row.data());
    // selection: the k best, listed ascending; the rest of the list is -1
    order = included;
    auto before = [&](int32_t x, int32_t y) { return ranks_before(score.data(), x, y); };
    std::nth_element(order.begin(), order.begin() + k, order.end(), before);
    std::sort(order.begin(), order.begin() + k);
    for (int64_t t = 0; t < a.p.topk; ++t) a.r.q2k_idx.at(b, hq, i, t) = t < k ? order[t] : -1;
    a.r.q2k_num.at(b, hq, i) = static_cast<int32_t>(k);
  }
}

// out for q block qb of (b, hq): the coarse output of the block (gated) plus the fine output.
void combine_q_block(const ForwardArgs& a, int64_t b, int64_t hq, int64_t qb, float* oc, float* os,
                     float* g) {
  const int64_t D = a.p.fine.D;
  const int32_t dtype = a.p.fine.dtype;
  a.r.out_c.load_row(b, hq, qb, oc);
  for (int64_t t = 0; t < kBlock; ++t) {
    const int64_t s = qb * kBlock + t;
    a.r.out_s.load_row(b, hq, s, os);
    if (a.gate != nullptr) {
      a.gate->load_row(b, hq, s, g);
      for (int64_t d = 0; d < D; ++d) os[d] += round_to_dtype(dtype, oc[d] * g[d]);
    } else {
      for (int64_t d = 0; d < D; ++d) os[d] += oc[d];
    }
    a.out.store_row(b, hq, s, os);
  }
}

}  // namespace

void vsa_layer_forward(const VsaLayerProblem& p, const AttnView& q, const AttnView& k,
                       const AttnView& v, const AttnView* gate, const I32View& q_block_sizes,
                       const I32View& kv_block_sizes, const AttnView& out, const I32View* q2k_idx,
                       const I32View* q2k_num, void* reserve, void* ws, int threads) {
  const VsaProblem& f = p.fine;
  const Reserve r = reserve_views(p, reserve);
  // A forward that stops half way (out of memory) must not leave a record the backward accepts.
  r.record->magic = 0;
  const ForwardArgs a{p, q, k, v, gate, q_block_sizes, kv_block_sizes, out, r};

  // 1. block means: q heads, then kv heads, as one list of items
  parallel_for(f.B * (f.Hq + f.Hkv), threads, [&](int64_t item) {
    const int64_t b = item / (f.Hq + f.Hkv), h = item % (f.Hq + f.Hkv);
    if (h < f.Hq) {
      block_means(q, b, h, f.num_q_blocks, q_block_sizes, r.q_c);
    } else {
      block_means(k, b, h - f.Hq, f.num_kv_blocks, kv_block_sizes, r.k_c);
      block_means(v, b, h - f.Hq, f.num_kv_blocks, kv_block_sizes, r.v_c);
    }
  });
  // 2. coarse attention and selection
  parallel_for(f.B * f.Hq, threads, [&](int64_t bh) { coarse_head(a, bh / f.Hq, bh % f.Hq); });
  // 3. fine branch
  vsa_forward(f, q, k, v, r.q2k_idx, r.q2k_num, kv_block_sizes, r.out_s, r.lse_s, ws, threads);
  // 4. out, and the lists for the caller
  const int64_t nq = f.num_q_blocks;
  vsa::parallel_chunks(f.B * f.Hq * nq, threads, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(3 * f.D));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t bh = item / nq;
      combine_q_block(a, bh / f.Hq, bh % f.Hq, item % nq, buf.data(), buf.data() + f.D,
                      buf.data() + 2 * f.D);
    }
  });
  if (q2k_idx != nullptr && q2k_num != nullptr) {
    for (int64_t b = 0; b < f.B; ++b)
      for (int64_t h = 0; h < f.Hq; ++h)
        for (int64_t i = 0; i < nq; ++i) {
          q2k_num->at(b, h, i) = r.q2k_num.at(b, h, i);
          for (int64_t t = 0; t < p.topk; ++t) q2k_idx->at(b, h, i, t) = r.q2k_idx.at(b, h, i, t);
        }
  }
  *r.record = vsa_layer_record(p);
}

}  // namespace fva::cpu
