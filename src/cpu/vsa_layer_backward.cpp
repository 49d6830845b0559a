// CPU reference of the whole VSA layer's backward (SPEC.md section 3b): FastVideo's torch autograd
// of the layer, with its roundings to the I/O dtype:
//   dgate = dtype(dout * out_c[block]);  dout_c[i] = dtype(Σ over block i's 64 slots of
//   dtype(dout * gate)) (or of dout);  dattn = dtype(dout_c·v_cᵀ), dv_c = dtype(attnᵀ·dout_c);
//   dscores = dtype(attn * (dattn - Σ_j dattn·attn));  ds = dtype(dscores * scale);
//   dq_c = dtype(ds·k_c), dk_c = dtype(dsᵀ·q_c);
// then the block means' backward gives each of block i's 64 slots (padding too) dtype(dx_c[i] *
// (1/size_i)) (none for a block of size 0, whose mean is the constant 0), which is added to the fine
// branch's gradient as torch accumulates two bf16 gradients: dq = dtype(dq_fine + that). With GQA
// (ours), dk_c and dv_c sum over the q heads of the kv head's group before their rounding.
//
// The fine branch's backward (vsa_backward, from the reserve's lists, out_s and lse_s) writes dq,
// dk and dv first; the coarse pass then runs over independent (batch, kv head) items, each owning
// its kv head's rows of dk and dv and its group's rows of dq and dgate, so the result does not
// depend on the thread count.
#include <algorithm>
#include <vector>

#include "cpu_ops.h"
#include "vsa_layer_common.h"

namespace fva::cpu {
namespace {

using namespace vsa_layer;

struct BackwardArgs {
  const VsaLayerProblem& p;
  const AttnView* gate;
  const I32View &q_sizes, &kv_sizes;
  const AttnView& dout;
  const Reserve& r;
  const AttnView &dq, &dk, &dv;
  const AttnView* dgate;
};

// rows [64 i, 64 i + 64) of head (b, h) of x += g (one D-vector), each sum rounded to the dtype.
void add_to_block(const AttnView& x, int64_t b, int64_t h, int64_t i, const float* g, float* row) {
  const int64_t D = x.shape[3];
  for (int64_t t = 0; t < kBlock; ++t) {
    x.load_row(b, h, i * kBlock + t, row);
    for (int64_t d = 0; d < D; ++d) row[d] += g[d];
    x.store_row(b, h, i * kBlock + t, row);
  }
}

// The block means' backward of n blocks: g = dtype(dx_c[i] * (1/size_i)) added to block i's slots.
void mean_backward(const AttnView& x, int64_t b, int64_t h, int64_t n, const I32View& sizes,
                   const float* dxc, int32_t dtype, float* g, float* row) {
  const int64_t D = x.shape[3];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t tokens = block_tokens(sizes, i);
    if (tokens == 0) continue;
    const float inv = inverse_size(tokens);
    for (int64_t d = 0; d < D; ++d) g[d] = round_to_dtype(dtype, dxc[i * D + d] * inv);
    add_to_block(x, b, h, i, g, row);
  }
}

// dout_c of (b, hq) and, with a gate, dgate of its rows.
void dout_c_and_dgate(const BackwardArgs& a, int64_t b, int64_t hq, const float* outc,
                      float* doutc) {
  const VsaProblem& f = a.p.fine;
  const int64_t D = f.D;
  const int32_t dtype = f.dtype;
  std::vector<float> dout(static_cast<size_t>(D)), gate(static_cast<size_t>(D)),
      dgate(static_cast<size_t>(D));
  std::vector<double> sum(static_cast<size_t>(D));
  for (int64_t i = 0; i < f.num_q_blocks; ++i) {
    const float* oc = outc + i * D;
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t t = 0; t < kBlock; ++t) {
      const int64_t s = i * kBlock + t;
      a.dout.load_row(b, hq, s, dout.data());
      if (a.gate != nullptr) {
        a.gate->load_row(b, hq, s, gate.data());
        for (int64_t d = 0; d < D; ++d) {
          sum[d] += round_to_dtype(dtype, dout[d] * gate[d]);
          dgate[d] = dout[d] * oc[d];
        }
        a.dgate->store_row(b, hq, s, dgate.data());
      } else {
        for (int64_t d = 0; d < D; ++d) sum[d] += dout[d];
      }
    }
    for (int64_t d = 0; d < D; ++d) doutc[i * D + d] = round_to_dtype(dtype, static_cast<float>(sum[d]));
  }
}

// The coarse branch's backward for one (batch, kv head) and the q heads of its group.
void coarse_backward(const BackwardArgs& a, int64_t b, int64_t hkv) {
  const VsaProblem& f = a.p.fine;
  const int64_t D = f.D, nq = f.num_q_blocks, nkv = f.num_kv_blocks, group = f.Hq / f.Hkv;
  const int32_t dtype = f.dtype;
  auto floats = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
  std::vector<float> kc = floats(nkv * D), vc = floats(nkv * D), qc = floats(nq * D),
                     outc = floats(nq * D), attn = floats(nq * nkv), doutc = floats(nq * D),
                     ds = floats(nq * nkv), dqc = floats(nq * D), dkvc = floats(nkv * D),
                     g = floats(D), row = floats(D), dattn = floats(nkv);
  std::vector<double> dkc(static_cast<size_t>(nkv * D), 0.0), dvc(static_cast<size_t>(nkv * D), 0.0);
  vsa::load_rows(a.r.k_c, b, hkv, 0, nkv, kc.data());
  vsa::load_rows(a.r.v_c, b, hkv, 0, nkv, vc.data());

  for (int64_t hq = hkv * group; hq < (hkv + 1) * group; ++hq) {
    vsa::load_rows(a.r.q_c, b, hq, 0, nq, qc.data());
    vsa::load_rows(a.r.out_c, b, hq, 0, nq, outc.data());
    vsa::load_rows(a.r.attn, b, hq, 0, nq, attn.data());
    dout_c_and_dgate(a, b, hq, outc.data(), doutc.data());

    for (int64_t i = 0; i < nq; ++i) {
      const float* w = attn.data() + i * nkv;
      const float* doc = doutc.data() + i * D;
      // dattn = dout_c·v_cᵀ and dv_c += attnᵀ·dout_c
      for (int64_t j = 0; j < nkv; ++j) {
        const float* vj = vc.data() + j * D;
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(doc[d]) * vj[d];
        dattn[j] = round_to_dtype(dtype, static_cast<float>(dot));
        if (w[j] != 0.0f)
          for (int64_t d = 0; d < D; ++d) dvc[j * D + d] += static_cast<double>(w[j]) * doc[d];
      }
      // softmax backward, then the scale
      double dot = 0.0;
      for (int64_t j = 0; j < nkv; ++j) dot += static_cast<double>(dattn[j]) * w[j];
      const float delta = static_cast<float>(dot);
      float* dsi = ds.data() + i * nkv;
      for (int64_t j = 0; j < nkv; ++j) {
        const float dscore = round_to_dtype(dtype, w[j] * (dattn[j] - delta));
        dsi[j] = round_to_dtype(dtype, dscore * f.scale);
      }
      // dq_c = ds·k_c and dk_c += dsᵀ·q_c
      const float* qi = qc.data() + i * D;
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0.0;
        for (int64_t j = 0; j < nkv; ++j) acc += static_cast<double>(dsi[j]) * kc[j * D + d];
        dqc[i * D + d] = round_to_dtype(dtype, static_cast<float>(acc));
      }
      for (int64_t j = 0; j < nkv; ++j) {
        if (dsi[j] == 0.0f) continue;
        for (int64_t d = 0; d < D; ++d) dkc[j * D + d] += static_cast<double>(dsi[j]) * qi[d];
      }
    }
    mean_backward(a.dq, b, hq, nq, a.q_sizes, dqc.data(), dtype, g.data(), row.data());
  }
  for (size_t x = 0; x < dkvc.size(); ++x) dkvc[x] = round_to_dtype(dtype, static_cast<float>(dkc[x]));
  mean_backward(a.dk, b, hkv, nkv, a.kv_sizes, dkvc.data(), dtype, g.data(), row.data());
  for (size_t x = 0; x < dkvc.size(); ++x) dkvc[x] = round_to_dtype(dtype, static_cast<float>(dvc[x]));
  mean_backward(a.dv, b, hkv, nkv, a.kv_sizes, dkvc.data(), dtype, g.data(), row.data());
}

}  // namespace

void vsa_layer_backward(const VsaLayerProblem& p, const AttnView& q, const AttnView& k,
                        const AttnView& v, const AttnView* gate, const I32View& q_block_sizes,
                        const I32View& kv_block_sizes, const AttnView& dout, const void* reserve,
                        const AttnView& dq, const AttnView& dk, const AttnView& dv,
                        const AttnView* dgate, void* ws, int threads) {
  const VsaProblem& f = p.fine;
  // The backward only reads the reserve; the views are typed for both directions.
  const Reserve r = reserve_views(p, const_cast<void*>(reserve));
  vsa_backward(f, q, k, v, r.out_s, r.lse_s, dout, r.q2k_idx, r.q2k_num, kv_block_sizes, dq, dk, dv,
               ws, threads);
  const BackwardArgs a{p, gate, q_block_sizes, kv_block_sizes, dout, r, dq, dk, dv, dgate};
  parallel_for(f.B * f.Hkv, threads, [&](int64_t bh) { coarse_backward(a, bh / f.Hkv, bh % f.Hkv); });
}

}  // namespace fva::cpu
