// QAT attention forward on the CPU (SPEC.md section 2): FastVideo's online softmax in base 2 over
// 32-key tiles, with P fake-quantized relative to the running max, one work item per 32-query tile.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_ops.h"
#include "parallel.h"
#include "qat_prepare.h"

namespace fva::cpu {

using namespace qat;  // the shared QAT pieces of qat_prepare.h

namespace {

constexpr double kLog2e = 1.4426950408889634;
// What FastVideo adds to a masked logit (before the softmax scale): finite, so a row never sees
// inf - inf, and far enough below any real logit that exp2 gives exactly 0.
constexpr float kMaskedLogit = -1.0e6f;

struct ForwardContext {
  const QatProblem& p;
  const QatTensors& t;
  const AttnView& o;
  const AttnView* o_hp;
  const F32View& lse;
  int32_t dtype;
  float scale_log2;  // softmax scale * log2(e), one fp32 value like FastVideo's qk_scale
};

// One query tile of one (b, h): rows [i0, i0 + rows) against every visible key tile.
void forward_query_tile(const ForwardContext& cx, int64_t b, int64_t h, int64_t i0) {
  const QatProblem& p = cx.p;
  const int64_t D = p.D;
  const bool quantize = p.cfg.quantize != 0;
  const bool causal = p.cfg.causal != 0;
  const int64_t rows = std::min(kQatTile, p.Sq - i0);
  const int64_t hk = h / (p.Hq / p.Hkv);
  const float* Q = cx.t.fq + ((b * p.Hq + h) * p.Sq + i0) * D;
  const float* K = cx.t.fk + (b * p.Hkv + hk) * p.Skv * D;
  const float* V = cx.t.fv + (b * p.Hkv + hk) * p.Skv * D;

  std::vector<float> acc(static_cast<size_t>(kQatTile * D), 0.0f);
  // acc_hp accumulates bf16(p) v next to acc's bf16(pq) v; without quantization they are the same.
  std::vector<float> acc_hp(quantize ? acc.size() : 0, 0.0f);
  float s[kQatTile * kQatTile];
  float pq[kQatTile * kQatTile];
  float m[kQatTile], l[kQatTile], alpha[kQatTile];
  std::fill(m, m + kQatTile, -std::numeric_limits<float>::infinity());
  std::fill(l, l + kQatTile, 0.0f);

  // Causal: key tiles past the last row's diagonal are fully masked; with m already finite (key 0 is
  // visible to every row, and it lies in the first tile) they would leave m, l and acc unchanged.
  int64_t key_tiles = (p.Skv + kQatTile - 1) / kQatTile;
  if (causal) key_tiles = std::min(key_tiles, (i0 + rows - 1) / kQatTile + 1);

  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    const int64_t j0 = kt * kQatTile;
    const int64_t cols = std::min(kQatTile, p.Skv - j0);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      float* sr = s + r * kQatTile;
      float rowmax = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < kQatTile; ++c) {
        const int64_t j = j0 + c;
        const bool visible = c < cols && !(causal && j > i);
        sr[c] = visible ? dot(Q + r * D, K + j * D, D) : kMaskedLogit;
        rowmax = std::max(rowmax, sr[c]);
      }
      const float m_new = std::max(m[r], rowmax * cx.scale_log2);
      for (int64_t c = 0; c < kQatTile; ++c) sr[c] = std::exp2(sr[c] * cx.scale_log2 - m_new);
      alpha[r] = std::exp2(m[r] - m_new);
      m[r] = m_new;
    }
    if (quantize) nvfp4_quantize_p_tile(s, pq, rows, cols, p.cfg.p_scale, cx.dtype);

    for (int64_t r = 0; r < rows; ++r) {
      const float* pr = s + r * kQatTile;
      float* ar = acc.data() + r * D;
      scale_in_place(ar, alpha[r], D);
      float row_sum = 0.0f;
      // Keys past Skv have p == 0 and no v row: leaving them out changes no sum.
      if (quantize) {
        float* hr = acc_hp.data() + r * D;
        scale_in_place(hr, alpha[r], D);
        for (int64_t c = 0; c < cols; ++c) {
          const float ph = round_to_dtype(cx.dtype, pr[c]);
          row_sum += ph;  // l uses the unquantized p, rounded to the dtype
          axpy(ar, pq[r * kQatTile + c], V + (j0 + c) * D, D);
          axpy(hr, ph, V + (j0 + c) * D, D);
        }
      } else {
        for (int64_t c = 0; c < cols; ++c) {
          row_sum += pr[c];  // FastVideo's plain path sums the fp32 p
          axpy(ar, round_to_dtype(cx.dtype, pr[c]), V + (j0 + c) * D, D);
        }
      }
      l[r] = l[r] * alpha[r] + row_sum;
    }
  }

  std::vector<float> out(static_cast<size_t>(D));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    const float* ar = acc.data() + r * D;
    for (int64_t d = 0; d < D; ++d) out[d] = ar[d] / l[r];
    cx.o.store_row(b, h, i, out.data());
    if (cx.o_hp != nullptr) {
      if (quantize) {
        const float* hr = acc_hp.data() + r * D;
        for (int64_t d = 0; d < D; ++d) out[d] = hr[d] / l[r];
      }
      cx.o_hp->store_row(b, h, i, out.data());
    }
    cx.lse.at(b, h, i) = m[r] + std::log2(l[r]);
  }
}

}  // namespace

size_t qat_forward_workspace(const QatProblem& p) { return qat_layout(p).end + kWorkspaceBasePad; }

void qat_forward(const QatProblem& p, const AttnView& q, const AttnView& k, const AttnView& v,
                 const AttnView& o, const AttnView* o_hp, const F32View& lse, void* ws,
                 int threads) {
  const QatTensors t =
      qat_prepare(p, q, k, v, p.cfg.quantize != 0, workspace_base(ws), threads);
  const ForwardContext cx{p, t, o, o_hp, lse, q.dtype,
                          static_cast<float>(static_cast<double>(p.scale) * kLog2e)};
  const int64_t q_tiles = (p.Sq + kQatTile - 1) / kQatTile;
  parallel_for(p.B * p.Hq * q_tiles, threads, [&](int64_t u) {
    const int64_t bh = u / q_tiles;
    forward_query_tile(cx, bh / p.Hq, bh % p.Hq, (u % q_tiles) * kQatTile);
  });
}

}  // namespace fva::cpu
