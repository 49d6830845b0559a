// QAT attention backward on the CPU (SPEC.md section 2): recomputes the normalized P from the
// forward's lse tile by tile (32 x 32), dV from the (optionally fake-quantized) P, dQ and dK from
// dS = bf16(P * (dP - Delta)). One work item per (b, kv head): it walks the q heads of its GQA group
// in order, so dK and dV are accumulated in a fixed order whatever the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_ops.h"
#include "parallel.h"
#include "qat_prepare.h"

namespace fva::cpu {

using namespace qat;  // the shared QAT pieces of qat_prepare.h

namespace {

constexpr double kLog2e = 1.4426950408889634;

struct BackwardContext {
  const QatProblem& p;
  const QatTensors& t;
  const float* delta;  // [B, Hq, Sq]
  const F32View& lse;
  const AttnView& dout;
  const AttnView& dq;
  const AttnView& dk;
  const AttnView& dv;
  int32_t dtype;
  float scale_log2;
  bool quantize_p;  // dV from FQ_P(P)
};

// Delta_i = sum_d o_for_bwd * dout over one (b, h) (fp32, like FastVideo's preprocess kernel).
void compute_delta(const QatProblem& p, const AttnView& o, const AttnView& dout, int64_t b,
                   int64_t h, float* delta) {
  std::vector<float> orow(static_cast<size_t>(p.D)), drow(static_cast<size_t>(p.D));
  for (int64_t i = 0; i < p.Sq; ++i) {
    o.load_row(b, h, i, orow.data());
    dout.load_row(b, h, i, drow.data());
    delta[i] = dot(orow.data(), drow.data(), p.D);
  }
}

void backward_kv_head(const BackwardContext& cx, int64_t b, int64_t hk) {
  const QatProblem& p = cx.p;
  const int64_t D = p.D;
  const bool causal = p.cfg.causal != 0;
  const bool smooth = p.cfg.smooth_k != 0;
  const int64_t group = p.Hq / p.Hkv;
  const float* K = cx.t.fk + (b * p.Hkv + hk) * p.Skv * D;
  const float* V = cx.t.fv + (b * p.Hkv + hk) * p.Skv * D;

  std::vector<float> dk_acc(static_cast<size_t>(p.Skv * D), 0.0f);
  std::vector<float> dv_acc(static_cast<size_t>(p.Skv * D), 0.0f);
  std::vector<float> dq_acc(static_cast<size_t>(p.Sq * D));
  std::vector<float> dO(static_cast<size_t>(p.Sq * D));
  std::vector<float> ds_rowsum(static_cast<size_t>(p.Sq));
  std::vector<float> row(static_cast<size_t>(D));
  float P[kQatTile * kQatTile];
  float Pv[kQatTile * kQatTile];  // what dV multiplies: bf16(FQ_P(P)) or bf16(P)
  float dS[kQatTile * kQatTile];

  const int64_t q_tiles = (p.Sq + kQatTile - 1) / kQatTile;
  const int64_t all_key_tiles = (p.Skv + kQatTile - 1) / kQatTile;

  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const float* Q = cx.t.fq + (b * p.Hq + h) * p.Sq * D;
    const float* delta = cx.delta + (b * p.Hq + h) * p.Sq;
    for (int64_t i = 0; i < p.Sq; ++i) cx.dout.load_row(b, h, i, dO.data() + i * D);
    std::fill(dq_acc.begin(), dq_acc.end(), 0.0f);
    std::fill(ds_rowsum.begin(), ds_rowsum.end(), 0.0f);

    for (int64_t qt = 0; qt < q_tiles; ++qt) {
      const int64_t i0 = qt * kQatTile;
      const int64_t rows = std::min(kQatTile, p.Sq - i0);
      float lse_r[kQatTile];
      for (int64_t r = 0; r < rows; ++r) lse_r[r] = cx.lse.at(b, h, i0 + r);
      // Causal: key tiles wholly above the diagonal have P == 0 and contribute nothing.
      const int64_t key_tiles =
          causal ? std::min(all_key_tiles, (i0 + rows - 1) / kQatTile + 1) : all_key_tiles;

      for (int64_t kt = 0; kt < key_tiles; ++kt) {
        const int64_t j0 = kt * kQatTile;
        const int64_t cols = std::min(kQatTile, p.Skv - j0);
        // The normalized P of the tile; masked and padding keys are exactly 0.
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          for (int64_t c = 0; c < kQatTile; ++c) {
            const int64_t j = j0 + c;
            const bool visible = c < cols && !(causal && j > i);
            P[r * kQatTile + c] =
                visible ? std::exp2(dot(Q + i * D, K + j * D, D) * cx.scale_log2 - lse_r[r]) : 0.0f;
          }
        }
        if (cx.quantize_p) {
          nvfp4_quantize_p_tile(P, Pv, rows, cols, p.cfg.p_scale, cx.dtype);
        } else {
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c)
              Pv[r * kQatTile + c] = round_to_dtype(cx.dtype, P[r * kQatTile + c]);
        }

        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          const float* dOi = dO.data() + i * D;
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t j = j0 + c;
            axpy(dv_acc.data() + j * D, Pv[r * kQatTile + c], dOi, D);
            const float dp = dot(dOi, V + j * D, D);
            // Straight-through: dS uses the unquantized P.
            dS[r * kQatTile + c] = round_to_dtype(cx.dtype, P[r * kQatTile + c] * (dp - delta[i]));
          }
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          float* dqi = dq_acc.data() + i * D;
          float sum = 0.0f;
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t j = j0 + c;
            const float ds = dS[r * kQatTile + c];
            sum += ds;
            axpy(dqi, ds, K + j * D, D);
            axpy(dk_acc.data() + j * D, ds, Q + i * D, D);
          }
          ds_rowsum[i] += sum;
        }
      }
    }

    // dQ = scale * (dS fk + rowsum(dS) mean): the mean term is the gradient through k - mean(k)
    // that FastVideo keeps for q (the smoothed keys' dot products equal the original ones up to it).
    for (int64_t i = 0; i < p.Sq; ++i) {
      const float* a = dq_acc.data() + i * D;
      for (int64_t d = 0; d < D; ++d)
        row[d] = p.scale * (smooth ? a[d] + ds_rowsum[i] * cx.t.k_mean[d] : a[d]);
      cx.dq.store_row(b, h, i, row.data());
    }
  }

  for (int64_t j = 0; j < p.Skv; ++j) {
    const float* a = dk_acc.data() + j * D;
    for (int64_t d = 0; d < D; ++d) row[d] = p.scale * a[d];
    cx.dk.store_row(b, hk, j, row.data());
    cx.dv.store_row(b, hk, j, dv_acc.data() + j * D);
  }
}

}  // namespace

size_t qat_backward_workspace(const QatProblem& p) {
  const size_t delta_bytes =
      align_up(static_cast<size_t>(p.B * p.Hq * p.Sq) * sizeof(float), kQatWorkspaceAlign);
  return qat_layout(p).end + delta_bytes + kQatWorkspacePad;
}

void qat_backward(const QatProblem& p, const AttnView& q, const AttnView& k, const AttnView& v,
                  const AttnView& o_for_bwd, const F32View& lse, const AttnView& dout,
                  const AttnView& dq, const AttnView& dk, const AttnView& dv, void* ws,
                  int threads) {
  const bool quantize = p.cfg.quantize != 0;
  char* base = qat_workspace_base(ws);
  // FastVideo's use_qat_qkv_backward = 0 runs the backward on the unquantized (but smoothed) inputs.
  const QatTensors t =
      qat_prepare(p, q, k, v, quantize && p.cfg.quantized_qkv_backward != 0, base, threads);
  float* delta = reinterpret_cast<float*>(base + qat_layout(p).end);
  parallel_for(p.B * p.Hq, threads, [&](int64_t u) {
    compute_delta(p, o_for_bwd, dout, u / p.Hq, u % p.Hq, delta + u * p.Sq);
  });

  const BackwardContext cx{p,  t,  delta,   lse,
                           dout, dq, dk, dv, q.dtype,
                           static_cast<float>(static_cast<double>(p.scale) * kLog2e),
                           quantize && p.cfg.quantize_p_backward != 0};
  parallel_for(p.B * p.Hkv, threads,
               [&](int64_t u) { backward_kv_head(cx, u / p.Hkv, u % p.Hkv); });
}

}  // namespace fva::cpu
