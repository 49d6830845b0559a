// QAT attention backward on the CPU (SPEC.md section 2): recomputes the normalized P from the
// forward's lse tile by tile (32 x 32), dV from the (optionally fake-quantized) P, dQ and dK from
// dS = bf16(P * (dP - Delta)).
//
// Two passes, each over fully independent items, so every output element is summed in one fixed
// order whatever the thread count, and even B = 1 with few heads gives every thread work:
//   1. per (b, q head, 32-row q tile): Delta of its rows (kept in the workspace for pass 2), P and
//      dS against every key tile it sees, and its dQ (key tiles ascending);
//   2. per (b, kv head, 32-key kv tile): dK and dV, summed over the q heads of its GQA group in
//      ascending order and, within each, its q tiles and their rows in ascending order.
// These are the orders a single item per (b, kv head) sums in, so the split changes no result.
// Pass 2 recomputes P and dS rather than taking them from pass 1: keeping them would take
// B*Hq*Sq*Skv floats each, and accumulating dK/dV in pass 1 would need atomics or per-thread partial
// sums, whose order depends on scheduling. The recomputation is exact: P, dS and FQ_P(P) (per
// 32 x 32 tile, the same tiles in both passes) come from the same inputs through the same code.
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
constexpr int64_t kTileElems = kQatTile * kQatTile;

// y[0, n) += a[t * a_stride] * x[t * n, (t + 1) * n) for t = 0, 1, ..., m - 1, in that order: per
// element the same additions as m axpy calls, but each chunk of y stays in registers across all m
// of them instead of going through memory m times.
void axpy_rows(float* y, const float* a, int64_t a_stride, const float* x, int64_t m, int64_t n) {
  constexpr int64_t kChunk = 16;
  int64_t d0 = 0;
  for (; d0 + kChunk <= n; d0 += kChunk) {
    float acc[kChunk];
    for (int64_t l = 0; l < kChunk; ++l) acc[l] = y[d0 + l];
    for (int64_t t = 0; t < m; ++t) {
      const float at = a[t * a_stride];
      const float* xt = x + t * n + d0;
      for (int64_t l = 0; l < kChunk; ++l) acc[l] += at * xt[l];
    }
    for (int64_t l = 0; l < kChunk; ++l) y[d0 + l] = acc[l];
  }
  for (; d0 < n; ++d0)
    for (int64_t t = 0; t < m; ++t) y[d0] += a[t * a_stride] * x[t * n + d0];
}

struct BackwardContext {
  const QatProblem& p;
  const QatTensors& t;
  float* delta;  // [B, Hq, Sq] in the workspace: written by pass 1, read by pass 2
  const AttnView& o_for_bwd;
  const F32View& lse;
  const AttnView& dout;
  const AttnView& dq;
  const AttnView& dk;
  const AttnView& dv;
  int32_t dtype;
  float scale_log2;
  bool quantize_p;  // dV from FQ_P(P)
  int64_t q_tiles, kv_tiles;

  // How many key tiles (from the first) q tile qt visits. Causal: tiles wholly above the diagonal
  // have P == 0 and contribute nothing. Both passes ask this one function, so they agree on which
  // (q tile, key tile) pairs exist.
  int64_t key_tiles(int64_t qt) const {
    if (p.cfg.causal == 0) return kv_tiles;
    const int64_t last_row = std::min(p.Sq, (qt + 1) * kQatTile) - 1;
    return std::min(kv_tiles, last_row / kQatTile + 1);
  }
};

// One q tile of one (b, q head) as both passes use it.
struct QTile {
  int64_t i0 = 0, rows = 0;
  const float* Q = nullptr;      // fq rows i0.. (row stride D)
  const float* delta = nullptr;  // Delta of rows i0..
  float lse[kQatTile];
};

// Fills q and loads the tile's dO rows (fp32, row stride D) into dO.
void load_q_tile(const BackwardContext& cx, int64_t b, int64_t h, int64_t qt, float* dO, QTile& q) {
  const QatProblem& p = cx.p;
  q.i0 = qt * kQatTile;
  q.rows = std::min(kQatTile, p.Sq - q.i0);
  q.Q = cx.t.fq + ((b * p.Hq + h) * p.Sq + q.i0) * p.D;
  q.delta = cx.delta + (b * p.Hq + h) * p.Sq + q.i0;
  for (int64_t r = 0; r < q.rows; ++r) {
    cx.dout.load_row(b, h, q.i0 + r, dO + r * p.D);
    q.lse[r] = cx.lse.at(b, h, q.i0 + r);
  }
}

// P and dS of q tile `q` against key tile kt (K, V: fk, fv of the tile's kv head). P covers the
// whole 32 x 32 tile, masked and padding entries exactly 0; dS = dtype(P * (dO·fv - Delta)) covers
// the real keys.
void p_ds_tile(const BackwardContext& cx, const QTile& q, const float* dO, const float* K,
               const float* V, int64_t kt, float* P, float* dS) {
  const int64_t D = cx.p.D;
  const bool causal = cx.p.cfg.causal != 0;
  const int64_t j0 = kt * kQatTile;
  const int64_t cols = std::min(kQatTile, cx.p.Skv - j0);
  for (int64_t r = 0; r < q.rows; ++r) {
    const int64_t i = q.i0 + r;
    const float* Qi = q.Q + r * D;
    for (int64_t c = 0; c < kQatTile; ++c) {
      const int64_t j = j0 + c;
      const bool visible = c < cols && !(causal && j > i);
      P[r * kQatTile + c] =
          visible ? std::exp2(dot(Qi, K + j * D, D) * cx.scale_log2 - q.lse[r]) : 0.0f;
    }
  }
  for (int64_t r = 0; r < q.rows; ++r) {
    const float* dOi = dO + r * D;
    for (int64_t c = 0; c < cols; ++c) {
      const float dp = dot(dOi, V + (j0 + c) * D, D);
      // Straight-through: dS uses the unquantized P.
      dS[r * kQatTile + c] = round_to_dtype(cx.dtype, P[r * kQatTile + c] * (dp - q.delta[r]));
    }
  }
}

// Pass 1: Delta, then dQ = scale * (dS fk + rowsum(dS) mean) of one q tile.
void backward_q_tile(const BackwardContext& cx, int64_t b, int64_t h, int64_t qt) {
  const QatProblem& p = cx.p;
  const int64_t D = p.D;
  const int64_t hk = h / (p.Hq / p.Hkv);
  const float* K = cx.t.fk + (b * p.Hkv + hk) * p.Skv * D;
  const float* V = cx.t.fv + (b * p.Hkv + hk) * p.Skv * D;

  std::vector<float> dO(static_cast<size_t>(kQatTile * D));
  std::vector<float> dq_acc(static_cast<size_t>(kQatTile * D), 0.0f);
  std::vector<float> row(static_cast<size_t>(D));
  float ds_rowsum[kQatTile] = {};
  float P[kTileElems];
  float dS[kTileElems];

  QTile q;
  load_q_tile(cx, b, h, qt, dO.data(), q);
  // Delta_i = sum_d o_for_bwd * dout (fp32, like FastVideo's preprocess kernel). Only this item
  // writes these rows; pass 2 reads them once this pass has finished.
  float* delta = cx.delta + (b * p.Hq + h) * p.Sq + q.i0;
  for (int64_t r = 0; r < q.rows; ++r) {
    cx.o_for_bwd.load_row(b, h, q.i0 + r, row.data());
    delta[r] = dot(row.data(), dO.data() + r * D, D);
  }

  const int64_t key_tiles = cx.key_tiles(qt);
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    const int64_t j0 = kt * kQatTile;
    const int64_t cols = std::min(kQatTile, p.Skv - j0);
    p_ds_tile(cx, q, dO.data(), K, V, kt, P, dS);
    for (int64_t r = 0; r < q.rows; ++r) {
      const float* ds = dS + r * kQatTile;
      float sum = 0.0f;
      for (int64_t c = 0; c < cols; ++c) sum += ds[c];
      ds_rowsum[r] += sum;
      axpy_rows(dq_acc.data() + r * D, ds, 1, K + j0 * D, cols, D);
    }
  }

  // The mean term is the gradient through k - mean(k) that FastVideo keeps for q (the smoothed
  // keys' dot products equal the original ones up to it).
  const bool smooth = p.cfg.smooth_k != 0;
  for (int64_t r = 0; r < q.rows; ++r) {
    const float* a = dq_acc.data() + r * D;
    for (int64_t d = 0; d < D; ++d)
      row[d] = p.scale * (smooth ? a[d] + ds_rowsum[r] * cx.t.k_mean[d] : a[d]);
    cx.dq.store_row(b, h, q.i0 + r, row.data());
  }
}

// Pass 2: dV = bf16(FQ_P(P) or P)ᵀ·dO and dK = scale·dSᵀ·fq of one key tile.
void backward_kv_tile(const BackwardContext& cx, int64_t b, int64_t hk, int64_t kt) {
  const QatProblem& p = cx.p;
  const int64_t D = p.D;
  const int64_t group = p.Hq / p.Hkv;
  const float* K = cx.t.fk + (b * p.Hkv + hk) * p.Skv * D;
  const float* V = cx.t.fv + (b * p.Hkv + hk) * p.Skv * D;
  const int64_t j0 = kt * kQatTile;
  const int64_t cols = std::min(kQatTile, p.Skv - j0);

  std::vector<float> dO(static_cast<size_t>(kQatTile * D));
  std::vector<float> dk_acc(static_cast<size_t>(kQatTile * D), 0.0f);
  std::vector<float> dv_acc(static_cast<size_t>(kQatTile * D), 0.0f);
  std::vector<float> row(static_cast<size_t>(D));
  float P[kTileElems];
  float Pv[kTileElems];  // what dV multiplies: bf16(FQ_P(P)) or bf16(P)
  float dS[kTileElems];

  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    for (int64_t qt = 0; qt < cx.q_tiles; ++qt) {
      if (kt >= cx.key_tiles(qt)) continue;  // a pair pass 1 skipped: P == 0 there
      QTile q;
      load_q_tile(cx, b, h, qt, dO.data(), q);
      p_ds_tile(cx, q, dO.data(), K, V, kt, P, dS);
      if (cx.quantize_p) {
        nvfp4_quantize_p_tile(P, Pv, q.rows, cols, p.cfg.p_scale, cx.dtype);
      } else {
        for (int64_t r = 0; r < q.rows; ++r)
          for (int64_t c = 0; c < cols; ++c)
            Pv[r * kQatTile + c] = round_to_dtype(cx.dtype, P[r * kQatTile + c]);
      }
      // Key c's gradients sum over the tile's rows in ascending order: columns of Pv and dS.
      for (int64_t c = 0; c < cols; ++c) {
        axpy_rows(dv_acc.data() + c * D, Pv + c, kQatTile, dO.data(), q.rows, D);
        axpy_rows(dk_acc.data() + c * D, dS + c, kQatTile, q.Q, q.rows, D);
      }
    }
  }

  for (int64_t c = 0; c < cols; ++c) {
    const float* a = dk_acc.data() + c * D;
    for (int64_t d = 0; d < D; ++d) row[d] = p.scale * a[d];
    cx.dk.store_row(b, hk, j0 + c, row.data());
    cx.dv.store_row(b, hk, j0 + c, dv_acc.data() + c * D);
  }
}

}  // namespace

// The workspace: qat_prepare's fq, fk, fv, k_mean, then Delta [B, Hq, Sq] fp32 (the one thing pass 1
// hands to pass 2).
size_t qat_backward_workspace(const QatProblem& p) {
  const size_t delta_bytes =
      workspace_round_up(static_cast<size_t>(p.B * p.Hq * p.Sq) * sizeof(float));
  return qat_layout(p).end + delta_bytes + kWorkspaceBasePad;
}

void qat_backward(const QatProblem& p, const AttnView& q, const AttnView& k, const AttnView& v,
                  const AttnView& o_for_bwd, const F32View& lse, const AttnView& dout,
                  const AttnView& dq, const AttnView& dk, const AttnView& dv, void* ws,
                  int threads) {
  const bool quantize = p.cfg.quantize != 0;
  char* base = workspace_base(ws);
  // FastVideo's use_qat_qkv_backward = 0 runs the backward on the unquantized (but smoothed) inputs.
  const QatTensors t =
      qat_prepare(p, q, k, v, quantize && p.cfg.quantized_qkv_backward != 0, base, threads);
  float* delta = reinterpret_cast<float*>(base + qat_layout(p).end);

  const int64_t q_tiles = (p.Sq + kQatTile - 1) / kQatTile;
  const int64_t kv_tiles = (p.Skv + kQatTile - 1) / kQatTile;
  const BackwardContext cx{p,
                           t,
                           delta,
                           o_for_bwd,
                           lse,
                           dout,
                           dq,
                           dk,
                           dv,
                           q.dtype,
                           static_cast<float>(static_cast<double>(p.scale) * kLog2e),
                           quantize && p.cfg.quantize_p_backward != 0,
                           q_tiles,
                           kv_tiles};

  // Items are numbered tile-major so that, when causal, the heaviest come first (the last q tiles
  // in pass 1, the first kv tiles in pass 2) and the dynamic hand-out evens out the threads' loads.
  // The numbering decides only which thread runs an item, never a result.
  const int64_t q_heads = p.B * p.Hq;
  parallel_for(q_heads * q_tiles, threads, [&](int64_t u) {
    const int64_t bh = u % q_heads, qt = q_tiles - 1 - u / q_heads;
    backward_q_tile(cx, bh / p.Hq, bh % p.Hq, qt);
  });
  const int64_t kv_heads = p.B * p.Hkv;
  parallel_for(kv_heads * kv_tiles, threads, [&](int64_t u) {
    const int64_t bh = u % kv_heads, kt = u / kv_heads;
    backward_kv_tile(cx, bh / p.Hkv, bh % p.Hkv, kt);
  });
}

}  // namespace fva::cpu
