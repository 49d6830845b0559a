// reference64: SPEC.md section 3b, the whole VSA layer, in float64, written from the spec alone.
// The block means, the coarse scores (both roundings), the coarse weights and out_c are rounded to
// the dtype because the spec makes them part of the function; every other product and sum is double.
// The fine branch is this library's own section 3 reference (vsa_forward, vsa_backward).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "reference64.h"

namespace ref64 {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t T = kVsaBlock;

struct Dims {
  int64_t B, Hq, Hkv, nq, nkv, D, group;
};

Dims check_layer(const VsaLayerInputs& in) {
  const Shape qs = in.q.shape, ks = in.k.shape;
  if (qs.B < 1 || qs.H < 1 || ks.H < 1 || qs.H % ks.H != 0 || ks.B != qs.B || ks.D != qs.D ||
      in.v.shape.B != ks.B || in.v.shape.H != ks.H || in.v.shape.S != ks.S || in.v.shape.D != ks.D ||
      qs.S % T != 0 || ks.S % T != 0 || qs.S < T || ks.S < T)
    throw std::invalid_argument("ref64: VSA layer q/k/v shapes are inconsistent");
  if (in.has_gate && (in.gate.shape.B != qs.B || in.gate.shape.H != qs.H ||
                      in.gate.shape.S != qs.S || in.gate.shape.D != qs.D))
    throw std::invalid_argument("ref64: VSA layer gate is not shaped like q");
  const Dims d{qs.B, qs.H, ks.H, qs.S / T, ks.S / T, qs.D, qs.H / ks.H};
  if (in.q_block_sizes.size() != static_cast<size_t>(d.nq) ||
      in.kv_block_sizes.size() != static_cast<size_t>(d.nkv))
    throw std::invalid_argument("ref64: VSA layer block sizes have the wrong length");
  return d;
}

// The fine branch's lists: the selection, over the kv blocks' sizes.
VsaIndex fine_index(const Dims& d, const VsaLayerSelection& sel, const std::vector<int32_t>& kv_sizes) {
  VsaIndex idx;
  idx.B = d.B;
  idx.H = d.Hq;
  idx.num_q_blocks = d.nq;
  idx.max_k = sel.k;
  idx.q2k_idx = sel.q2k_idx;
  idx.q2k_num = sel.q2k_num;
  idx.block_sizes = kv_sizes;
  return idx;
}

int64_t tokens(const std::vector<int32_t>& sizes, int64_t i) {
  return std::clamp<int64_t>(sizes[static_cast<size_t>(i)], 0, T);
}

// Block means of x [B, H, 64 n, D]: the mean of each block's real tokens, rounded; 0 for size 0.
Tensor block_means(const Tensor& x, const std::vector<int32_t>& sizes, DType dt) {
  const Shape s = x.shape;
  const int64_t n = s.S / T;
  Tensor m(Shape{s.B, s.H, n, s.D});
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t len = tokens(sizes, i);
        if (len == 0) continue;
        for (int64_t d = 0; d < s.D; ++d) {
          double sum = 0.0;
          for (int64_t t = 0; t < len; ++t) sum += x.at(b, h, i * T + t, d);
          m.at(b, h, i, d) = round_dtype(dt, sum / static_cast<double>(len));
        }
      }
  return m;
}

Tensor rounded_copy(const Tensor& t, DType dt) {
  Tensor r = t;
  for (double& x : r.data) x = round_dtype(dt, x);
  return r;
}

}  // namespace

VsaLayerSelection vsa_layer_select(const std::vector<double>& scores, int64_t B, int64_t H,
                                   int64_t nq, const std::vector<int32_t>& kv_block_sizes,
                                   int64_t topk) {
  const int64_t nkv = static_cast<int64_t>(kv_block_sizes.size());
  if (topk < 1 || scores.size() != static_cast<size_t>(B * H * nq * nkv))
    throw std::invalid_argument("ref64: VSA layer selection arguments are inconsistent");
  VsaLayerSelection sel;
  sel.k = std::min(topk, nkv);
  sel.q2k_idx.assign(static_cast<size_t>(B * H * nq * sel.k), -1);
  sel.q2k_num.assign(static_cast<size_t>(B * H * nq), 0);
  for (int64_t row = 0; row < B * H * nq; ++row) {
    const double* s = scores.data() + row * nkv;
    std::vector<int32_t> cand;
    for (int64_t j = 0; j < nkv; ++j)
      if (tokens(kv_block_sizes, j) > 0) cand.push_back(static_cast<int32_t>(j));
    std::stable_sort(cand.begin(), cand.end(), [s](int32_t a, int32_t b) { return s[a] > s[b]; });
    const int64_t n = std::min<int64_t>(sel.k, static_cast<int64_t>(cand.size()));
    std::sort(cand.begin(), cand.begin() + n);
    for (int64_t t = 0; t < n; ++t) sel.q2k_idx[static_cast<size_t>(row * sel.k + t)] = cand[t];
    sel.q2k_num[static_cast<size_t>(row)] = static_cast<int32_t>(n);
  }
  return sel;
}

VsaLayerForward vsa_layer_forward(const VsaLayerConfig& cfg, DType dt, const VsaLayerInputs& in,
                                  const VsaLayerSelection* use) {
  const Dims d = check_layer(in);
  const Tensor q = rounded_copy(in.q, dt), k = rounded_copy(in.k, dt), v = rounded_copy(in.v, dt);
  VsaLayerForward f;
  f.q_c = block_means(q, in.q_block_sizes, dt);
  f.k_c = block_means(k, in.kv_block_sizes, dt);
  f.v_c = block_means(v, in.kv_block_sizes, dt);
  const size_t rows = static_cast<size_t>(d.B * d.Hq * d.nq);
  f.scores.assign(rows * static_cast<size_t>(d.nkv), -kInf);
  f.attn.assign(rows * static_cast<size_t>(d.nkv), 0.0);
  f.out_c = Tensor(Shape{d.B, d.Hq, d.nq, d.D});
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h) {
      const int64_t hk = h / d.group;
      for (int64_t i = 0; i < d.nq; ++i) {
        const size_t row = static_cast<size_t>((b * d.Hq + h) * d.nq + i) * static_cast<size_t>(d.nkv);
        double* s = f.scores.data() + row;
        double* a = f.attn.data() + row;
        double mx = -kInf;
        for (int64_t j = 0; j < d.nkv; ++j) {
          if (tokens(in.kv_block_sizes, j) == 0) continue;
          double dot = 0.0;
          for (int64_t x = 0; x < d.D; ++x) dot += f.q_c.at(b, h, i, x) * f.k_c.at(b, hk, j, x);
          dot = round_dtype(dt, dot);
          s[j] = round_dtype(dt, cfg.softmax_scale > 0.0 ? dot * cfg.softmax_scale
                                                         : dot / std::sqrt(static_cast<double>(d.D)));
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < d.nkv; ++j)
          if (s[j] > -kInf) sum += a[j] = std::exp(s[j] - mx);
        for (int64_t j = 0; j < d.nkv; ++j)
          if (s[j] > -kInf) a[j] = round_dtype(dt, a[j] / sum);
        for (int64_t x = 0; x < d.D; ++x) {
          double acc = 0.0;
          for (int64_t j = 0; j < d.nkv; ++j) acc += a[j] * f.v_c.at(b, hk, j, x);
          f.out_c.at(b, h, i, x) = round_dtype(dt, acc);
        }
      }
    }

  f.selection = use ? *use : vsa_layer_select(f.scores, d.B, d.Hq, d.nq, in.kv_block_sizes, cfg.topk);
  const VsaIndex idx = fine_index(d, f.selection, in.kv_block_sizes);
  VsaConfig fine_cfg;
  fine_cfg.softmax_scale = cfg.softmax_scale;
  f.fine = vsa_forward(fine_cfg, dt, q, k, v, idx);

  f.out = Tensor(q.shape);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h)
      for (int64_t s = 0; s < q.shape.S; ++s)
        for (int64_t x = 0; x < d.D; ++x) {
          const double oc = f.out_c.at(b, h, s / T, x);
          const double g = in.has_gate ? round_dtype(dt, in.gate.at(b, h, s, x)) : 1.0;
          f.out.at(b, h, s, x) = oc * g + f.fine.o.at(b, h, s, x);
        }
  return f;
}

VsaLayerGrads vsa_layer_backward(const VsaLayerConfig& cfg, DType dt, const VsaLayerInputs& in,
                                 const VsaLayerForward& f, const Tensor& dout_in) {
  const Dims d = check_layer(in);
  const Tensor q = rounded_copy(in.q, dt), k = rounded_copy(in.k, dt), v = rounded_copy(in.v, dt);
  const Tensor dout = rounded_copy(dout_in, dt);
  const double scale =
      cfg.softmax_scale > 0.0 ? cfg.softmax_scale : 1.0 / std::sqrt(static_cast<double>(d.D));

  // The fine branch.
  const VsaIndex idx = fine_index(d, f.selection, in.kv_block_sizes);
  VsaConfig fine_cfg;
  fine_cfg.softmax_scale = cfg.softmax_scale;
  const Grads fine = vsa_backward(fine_cfg, dt, q, k, v, f.fine.o, f.fine.lse, dout, idx);
  VsaLayerGrads g{fine.dq, fine.dk, fine.dv, Tensor()};
  if (in.has_gate) g.dgate = Tensor(q.shape);

  // The coarse branch: dout_c, then the softmax attention's backward, then the block means'.
  Tensor dqc(Shape{d.B, d.Hq, d.nq, d.D}), dkc(Shape{d.B, d.Hkv, d.nkv, d.D}),
      dvc(Shape{d.B, d.Hkv, d.nkv, d.D});
  std::vector<double> doc(static_cast<size_t>(d.D)), dattn(static_cast<size_t>(d.nkv)),
      ds(static_cast<size_t>(d.nkv));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h) {
      const int64_t hk = h / d.group;
      for (int64_t i = 0; i < d.nq; ++i) {
        std::fill(doc.begin(), doc.end(), 0.0);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t x = 0; x < d.D; ++x) {
            const int64_t s = i * T + t;
            const double gv = in.has_gate ? round_dtype(dt, in.gate.at(b, h, s, x)) : 1.0;
            doc[x] += dout.at(b, h, s, x) * gv;
            if (in.has_gate) g.dgate.at(b, h, s, x) = dout.at(b, h, s, x) * f.out_c.at(b, h, i, x);
          }
        const size_t row = static_cast<size_t>((b * d.Hq + h) * d.nq + i) * static_cast<size_t>(d.nkv);
        const double* a = f.attn.data() + row;
        double delta = 0.0;
        for (int64_t j = 0; j < d.nkv; ++j) {
          double dot = 0.0;
          for (int64_t x = 0; x < d.D; ++x) {
            dot += doc[x] * f.v_c.at(b, hk, j, x);
            dvc.at(b, hk, j, x) += a[j] * doc[x];
          }
          dattn[j] = dot;
          delta += dot * a[j];
        }
        for (int64_t j = 0; j < d.nkv; ++j) ds[j] = a[j] * (dattn[j] - delta) * scale;
        for (int64_t x = 0; x < d.D; ++x)
          for (int64_t j = 0; j < d.nkv; ++j) {
            dqc.at(b, h, i, x) += ds[j] * f.k_c.at(b, hk, j, x);
            dkc.at(b, hk, j, x) += ds[j] * f.q_c.at(b, h, i, x);
          }
      }
    }
  // Every slot of a block (padding too) gets d(mean) / size; a block of size 0 has a constant mean.
  auto spread = [](Tensor& grad, const Tensor& dmean, const std::vector<int32_t>& sizes) {
    const Shape s = grad.shape;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t i = 0; i < s.S / T; ++i) {
          const int64_t len = tokens(sizes, i);
          if (len == 0) continue;
          for (int64_t t = 0; t < T; ++t)
            for (int64_t x = 0; x < s.D; ++x)
              grad.at(b, h, i * T + t, x) += dmean.at(b, h, i, x) / static_cast<double>(len);
        }
  };
  spread(g.dq, dqc, in.q_block_sizes);
  spread(g.dk, dkc, in.kv_block_sizes);
  spread(g.dv, dvc, in.kv_block_sizes);
  return g;
}

}  // namespace ref64
