// CPU reference VSA backward (SPEC.md section 3): the exact gradient of what vsa_forward computed
// over the listed (q block, kv block) pairs, each listed entry one term (listed twice: two terms).
//
// After the k2q inverse is built (per (batch, q head), in the workspace), two passes, each over
// fully independent items, so results never depend on the thread count:
//   1. per (batch, q head, q block): Delta = rowsum(o·dO), stored in the workspace, and dQ over the
//      q block's list in list order;
//   2. per (batch, kv head, kv block): dK and dV over the q blocks that listed it, from the
//      inverse: q heads of the GQA group in order, q blocks ascending (SPEC's k2q order).
// P and dS are recomputed in pass 2 rather than shared with pass 1: that costs two more block
// products per pair but lets dK/dV parallelize over kv blocks without atomics or a per-thread
// reduction, which would make the sums' order depend on scheduling.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "vsa_common.h"

namespace fva::cpu {
namespace {

using namespace vsa;

// The workspace: Delta [B, Hq, Sq] fp32, then per (b, q head) a CSR inverse of its q2k lists:
// offsets [num_kv_blocks + 1] (int64) and the q block of each usable entry (int32).
struct BackwardWorkspace {
  float* delta;
  int64_t* offsets;
  int32_t* entries;
};

size_t delta_bytes(const VsaProblem& p) {
  return workspace_round_up(sizeof(float) * static_cast<size_t>(p.B * p.Hq * p.num_q_blocks * kBlock));
}
size_t offsets_bytes(const VsaProblem& p) {
  return workspace_round_up(sizeof(int64_t) * static_cast<size_t>(p.B * p.Hq * (p.num_kv_blocks + 1)));
}
size_t entries_bytes(const VsaProblem& p) {
  return workspace_round_up(sizeof(int32_t) * static_cast<size_t>(p.B * p.Hq * p.num_q_blocks * p.max_k));
}

BackwardWorkspace carve(const VsaProblem& p, void* ws) {
  char* base = workspace_base(ws);
  BackwardWorkspace w;
  w.delta = reinterpret_cast<float*>(base);
  w.offsets = reinterpret_cast<int64_t*>(base + delta_bytes(p));
  w.entries = reinterpret_cast<int32_t*>(base + delta_bytes(p) + offsets_bytes(p));
  return w;
}

struct BackwardArgs {
  const VsaProblem& p;
  const AttnView &q, &k, &v, &o, &dout;
  const F32View& lse;
  const I32View &q2k_idx, &q2k_num, &block_sizes;
  const AttnView &dq, &dk, &dv;
  BackwardWorkspace ws;
};

// For (b, hq): kv block kv's entries are entries[offsets[kv], offsets[kv + 1]), q blocks
// ascending, one per usable listed entry (duplicates kept). Entries whose block has no real token
// are left out: they contribute nothing.
void build_inverse(const BackwardArgs& a, int64_t b, int64_t hq) {
  const VsaProblem& p = a.p;
  const int64_t nkv = p.num_kv_blocks, nqb = p.num_q_blocks;
  const int64_t unit = b * p.Hq + hq;
  int64_t* off = a.ws.offsets + unit * (nkv + 1);
  int32_t* ent = a.ws.entries + unit * nqb * p.max_k;

  auto for_each_entry = [&](auto&& f) {
    for (int64_t qb = 0; qb < nqb; ++qb) {
      const int64_t count = list_count(a.q2k_num, b, hq, qb, p.max_k);
      for (int64_t t = 0; t < count; ++t) {
        const int64_t kv = a.q2k_idx.at(b, hq, qb, t);
        if (kv_in_range(kv, nkv) && kv_tokens(a.block_sizes, kv) > 0) f(qb, kv);
      }
    }
  };
  // Counting sort: counts in off[kv + 1], prefix sums make off[kv] the start, filling advances
  // off[kv] to the end of kv's run, and a shift by one restores the starts.
  std::fill(off, off + nkv + 1, int64_t{0});
  for_each_entry([&](int64_t, int64_t kv) { ++off[kv + 1]; });
  for (int64_t kv = 0; kv < nkv; ++kv) off[kv + 1] += off[kv];
  for_each_entry([&](int64_t qb, int64_t kv) { ent[off[kv]++] = static_cast<int32_t>(qb); });
  for (int64_t kv = nkv; kv > 0; --kv) off[kv] = off[kv - 1];
  off[0] = 0;
}

// fp32 buffers of one item, carved from one allocation.
struct BackwardScratch {
  std::vector<float> buf;
  float *q, *dout, *k, *kt, *tmp, *vt, *acc1, *acc2;  // [64 x D] or [D x 64] each
  float *s, *dp;                                      // [64 x 64] each
  float *lse, *col_p, *col_ds;                        // [64] each

  explicit BackwardScratch(int64_t D)
      : buf(static_cast<size_t>(8 * kBlock * D + 2 * kBlock * kBlock + 3 * kBlock)) {
    float* p = buf.data();
    for (float** f : {&q, &dout, &k, &kt, &tmp, &vt, &acc1, &acc2}) *f = p, p += kBlock * D;
    for (float** f : {&s, &dp}) *f = p, p += kBlock * kBlock;
    for (float** f : {&lse, &col_p, &col_ds}) *f = p, p += kBlock;
  }
};

// A row whose forward saw no key has lse = -inf and P = 0 (not 2^(x + inf)).
bool row_has_keys(float lse) { return lse != -std::numeric_limits<float>::infinity(); }

// A q block against a staged kv block (keys [0, n), transposed in kt and vt), [kBlock x kBlock]:
// P = 2^(q·kᵀ·c - lse) and dS = P ⊙ (dO·vᵀ - Delta), both rounded to the dtype (the GPU feeds
// them to its MMAs in the tensor dtype). On return s holds dtype(P) and dp holds dtype(dS).
void grad_block(float c, int32_t dtype, int64_t D, int64_t n, const float* q, const float* dout,
                const float* kt, const float* vt, const float* lse, const float* delta, float* s,
                float* dp) {
  score_block(q, kt, D, n, s);
  score_block(dout, vt, D, n, dp);
  for (int64_t i = 0; i < kBlock; ++i) {
    float* si = s + i * kBlock;
    float* dpi = dp + i * kBlock;
    if (!row_has_keys(lse[i])) {
      std::fill(si, si + n, 0.0f);
      std::fill(dpi, dpi + n, 0.0f);
      continue;
    }
    for (int64_t j = 0; j < n; ++j) {
      const float pj = std::exp2(si[j] * c - lse[i]);
      si[j] = round_to_dtype(dtype, pj);
      dpi[j] = round_to_dtype(dtype, pj * (dpi[j] - delta[i]));
    }
  }
}

// Pass 1 item: Delta and dQ of one q block.
void dq_q_block(const BackwardArgs& a, int64_t b, int64_t hq, int64_t qb, BackwardScratch& w) {
  const VsaProblem& p = a.p;
  const int64_t D = p.D;
  const int64_t hkv = hq / (p.Hq / p.Hkv);
  const int64_t s0 = qb * kBlock;
  const float c = p.scale * kLog2e;
  const int32_t dtype = a.q.dtype;

  // Delta = rowsum(o·dO) in fp32, kept for pass 2 (acc1 stages o for a moment).
  load_rows(a.o, b, hq, s0, kBlock, w.acc1);
  load_rows(a.dout, b, hq, s0, kBlock, w.dout);
  float* delta = a.ws.delta + (b * p.Hq + hq) * p.num_q_blocks * kBlock + s0;
  for (int64_t i = 0; i < kBlock; ++i) {
    float sum = 0.0f;
    for (int64_t d = 0; d < D; ++d) sum += w.acc1[i * D + d] * w.dout[i * D + d];
    delta[i] = sum;
    w.lse[i] = a.lse.at(b, hq, s0 + i);
  }
  std::fill(w.acc1, w.acc1 + kBlock * D, 0.0f);

  const int64_t count = list_count(a.q2k_num, b, hq, qb, p.max_k);
  bool loaded_q = false;
  for (int64_t t = 0; t < count; ++t) {
    const int64_t kv = a.q2k_idx.at(b, hq, qb, t);
    if (!kv_in_range(kv, p.num_kv_blocks)) continue;
    const int64_t n = kv_tokens(a.block_sizes, kv);
    if (n == 0) continue;
    if (!loaded_q) load_rows(a.q, b, hq, s0, kBlock, w.q), loaded_q = true;
    load_rows(a.k, b, hkv, kv * kBlock, n, w.k);
    transpose_rows(w.k, n, D, w.kt);
    load_rows(a.v, b, hkv, kv * kBlock, n, w.tmp);
    transpose_rows(w.tmp, n, D, w.vt);
    grad_block(c, dtype, D, n, w.q, w.dout, w.kt, w.vt, w.lse, delta, w.s, w.dp);
    for (int64_t i = 0; i < kBlock; ++i)  // dQ = dS·k
      accumulate_rows(w.dp + i * kBlock, n, w.k, D, w.acc1 + i * D);
  }
  store_rows(a.dq, b, hq, s0, kBlock, w.acc1, p.scale);  // dQ = scale·dS·k
}

// Pass 2 item: dK and dV of one kv block (all 64 slots; padding slots and unselected blocks get 0).
void dkdv_kv_block(const BackwardArgs& a, int64_t b, int64_t hkv, int64_t kv, BackwardScratch& w) {
  const VsaProblem& p = a.p;
  const int64_t D = p.D;
  const int64_t group = p.Hq / p.Hkv;
  const float c = p.scale * kLog2e;
  const int32_t dtype = a.q.dtype;
  const int64_t n = kv_tokens(a.block_sizes, kv);
  float* dk = w.acc1;
  float* dv = w.acc2;
  std::fill(dk, dk + kBlock * D, 0.0f);
  std::fill(dv, dv + kBlock * D, 0.0f);

  bool loaded_kv = false;
  for (int64_t hq = hkv * group; hq < (hkv + 1) * group; ++hq) {
    const int64_t unit = b * p.Hq + hq;
    const int64_t* off = a.ws.offsets + unit * (p.num_kv_blocks + 1);
    const int32_t* ent = a.ws.entries + unit * p.num_q_blocks * p.max_k;
    for (int64_t e = off[kv]; e < off[kv + 1]; ++e) {
      if (!loaded_kv) {  // n > 0 here: build_inverse left out empty blocks
        load_rows(a.k, b, hkv, kv * kBlock, n, w.tmp);
        transpose_rows(w.tmp, n, D, w.kt);
        load_rows(a.v, b, hkv, kv * kBlock, n, w.tmp);
        transpose_rows(w.tmp, n, D, w.vt);
        loaded_kv = true;
      }
      const int64_t s0 = int64_t{ent[e]} * kBlock;
      const float* delta = a.ws.delta + unit * p.num_q_blocks * kBlock + s0;
      load_rows(a.q, b, hq, s0, kBlock, w.q);
      load_rows(a.dout, b, hq, s0, kBlock, w.dout);
      for (int64_t i = 0; i < kBlock; ++i) w.lse[i] = a.lse.at(b, hq, s0 + i);
      grad_block(c, dtype, D, n, w.q, w.dout, w.kt, w.vt, w.lse, delta, w.s, w.dp);
      // Key j's gradients sum over the q block's rows in ascending order: columns of P and dS.
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < kBlock; ++i) {
          w.col_p[i] = w.s[i * kBlock + j];
          w.col_ds[i] = w.dp[i * kBlock + j];
        }
        accumulate_rows(w.col_p, kBlock, w.dout, D, dv + j * D);  // dV = Pᵀ·dO
        accumulate_rows(w.col_ds, kBlock, w.q, D, dk + j * D);    // dK = dSᵀ·q
      }
    }
  }
  store_rows(a.dk, b, hkv, kv * kBlock, kBlock, dk, p.scale);
  store_rows(a.dv, b, hkv, kv * kBlock, kBlock, dv, 1.0f);
}

}  // namespace

size_t vsa_backward_workspace(const VsaProblem& p) {
  return kWorkspaceBasePad + delta_bytes(p) + offsets_bytes(p) + entries_bytes(p);
}

void vsa_backward(const VsaProblem& p, const AttnView& q, const AttnView& k, const AttnView& v,
                  const AttnView& o, const F32View& lse, const AttnView& dout,
                  const I32View& q2k_idx, const I32View& q2k_num, const I32View& block_sizes,
                  const AttnView& dq, const AttnView& dk, const AttnView& dv, void* ws,
                  int threads) {
  const BackwardArgs args{p,       q,           k,  v,  o,  dout,        lse, q2k_idx,
                          q2k_num, block_sizes, dq, dk, dv, carve(p, ws)};
  const int64_t nqb = p.num_q_blocks, nkv = p.num_kv_blocks;

  parallel_for(p.B * p.Hq, threads, [&](int64_t bh) { build_inverse(args, bh / p.Hq, bh % p.Hq); });

  parallel_chunks(p.B * p.Hq * nqb, threads, [&](int64_t begin, int64_t end) {
    BackwardScratch w(p.D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t bh = item / nqb;
      dq_q_block(args, bh / p.Hq, bh % p.Hq, item % nqb, w);
    }
  });

  parallel_chunks(p.B * p.Hkv * nkv, threads, [&](int64_t begin, int64_t end) {
    BackwardScratch w(p.D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t bh = item / nkv;
      dkdv_kv_block(args, bh / p.Hkv, bh % p.Hkv, item % nkv, w);
    }
  });
}

}  // namespace fva::cpu
