// reference64: docs/SPEC.md sections 1-3 in float64. See reference64.h for what is double and what is
// rounded, and why. Written from the spec alone; shares no code with src/ or kernels/.
#include "reference64.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace fva {
float mufu_reciprocal(float y);  // the GPU's MUFU.RCP, what div.full.f32 passes it (fvattn_nvfp4_host)
}  // namespace fva

namespace ref64 {
namespace {

constexpr double kLog2e = 1.4426950408889634;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Rounds x to a binary floating-point format with `mant` fraction bits and smallest normal exponent
// `emin`, ties to even, subnormals kept, no upper clamp (callers handle overflow). Exact in double:
// x / q and the product are power-of-two scalings, and nearbyint rounds ties to even in the default
// rounding mode.
double round_format(double x, int mant, int emin) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  int ex = 0;
  std::frexp(x, &ex);  // |x| = m * 2^ex with m in [0.5, 1), so floor(log2|x|) = ex - 1
  const int e = std::max(ex - 1, emin);
  const double quantum = std::ldexp(1.0, e - mant);
  return std::nearbyint(x / quantum) * quantum;
}

// ---- threads --------------------------------------------------------------------------------------

// Runs f(0..n-1) on up to hardware_concurrency threads. Units must write disjoint outputs; the result
// does not depend on the thread count because each unit's arithmetic is sequential.
template <class F>
void parallel_for(int64_t n, F&& f) {
  unsigned hw = std::thread::hardware_concurrency();
  if (hw == 0) hw = 1;
  const int64_t nt = std::min<int64_t>(n, static_cast<int64_t>(hw));
  if (nt <= 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr err;
  std::mutex err_mu;
  auto worker = [&]() {
    for (;;) {
      const int64_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        f(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(err_mu);
        if (!err) err = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(nt - 1));
  for (int64_t t = 1; t < nt; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  if (err) std::rethrow_exception(err);
}

// ---- NVFP4 ------------------------------------------------------------------------------------------

// FastVideo's fp32 division in tile and row mode (SPEC section 1: Triton's `/`, PTX div.full.f32):
// operands scaled by 1/4 when |b| > 2^126 and by 2^24 when |b| is below 2^-126, then a times the
// GPU's approximate reciprocal, rounded. The reciprocal's bits are the hardware's, measured on the
// device: the one thing this reference takes from the library's side (fvattn_nvfp4_host's table).
float fastvideo_div(float a, float b) {
  const float ab = std::fabs(b);
  if (ab > 0x1p126f) a *= 0.25f, b *= 0.25f;
  if (!(ab >= 0x1p-126f)) a *= 0x1p24f, b *= 0x1p24f;
  return a * fva::mufu_reciprocal(b);
}

// Fake-quantizes one group of n <= 16 values with second-level encode factor enc (fp32). The scale
// arithmetic is fp32 as the spec writes it: s = e4m3(amax/6*enc), r = 1/(s*dec), y = x*r (multiply
// by the reciprocal, never x/s), x_q = (e2m1(y)*s)*dec rounded to dt. Block mode (tile false,
// enc = 1) divides correctly rounded; tile and row mode divide as FastVideo does.
void fq_group(const double* x, double* y, int n, float enc, bool tile, DType dt) {
  float xf[16];
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    xf[i] = static_cast<float>(x[i]);
    const float a = std::fabs(xf[i]);
    if (a > amax) amax = a;  // NaN compares false: it takes no part in the max
  }
  const auto div = [tile](float a, float b) { return tile ? fastvideo_div(a, b) : a / b; };
  const float dec = div(1.0f, enc);
  const float sarg = div(amax, 6.0f) * enc;
  const double s = round_e4m3(static_cast<double>(sarg));
  if (!(s > 0.0)) {  // the scale rounded to 0: exact zeros, never 0 * inf = NaN
    for (int i = 0; i < n; ++i) y[i] = 0.0;
    return;
  }
  const float sd = static_cast<float>(s) * dec;
  const float r = div(1.0f, sd);
  for (int i = 0; i < n; ++i) {
    const float yv = xf[i] * r;
    const double e = round_e2m1(static_cast<double>(yv));
    // Decode as FastVideo evaluates e2m1 * s * dec, left to right: e * s is exact (3 + 4 significant
    // bits), its product with dec is an fp32 value (rounded once to fp32, then to the dtype).
    const float es = static_cast<float>(e * s);
    y[i] = round_dtype(dt, static_cast<double>(es * dec));
  }
}

// enc of a tile or row whose max is amax: 2688 / max(amax, 1e-8), in fp32, FastVideo's division.
float second_level_enc(float amax) { return fastvideo_div(2688.0f, std::max(amax, 1e-8f)); }

// FQ along D of `rows` contiguous token rows of length D (D a multiple of 16), sharing one enc.
void fq_rows(const double* x, double* y, int64_t rows, int64_t D, Scale mode, DType dt) {
  float enc = 1.0f;
  if (mode == Scale::Tile) {
    float amax = 0.0f;
    for (int64_t i = 0; i < rows * D; ++i) {
      const float a = std::fabs(static_cast<float>(x[i]));
      if (a > amax) amax = a;
    }
    enc = second_level_enc(amax);
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < D; g += 16) fq_group(x + r * D + g, y + r * D + g, 16, enc, mode == Scale::Tile, dt);
}

// FQ_P of one P tile p[nr][ld] (valid part nr x nc, nc <= ld), groups of 16 along the key axis
// counted from the tile's first key. Padding (columns >= nc) takes no part and decodes to 0.
void fq_p_tile(const double* p, double* out, int64_t nr, int64_t nc, int64_t ld, Scale mode,
               DType dt) {
  float tile_enc = 1.0f;
  if (mode == Scale::Tile) {
    float amax = 0.0f;
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t c = 0; c < nc; ++c) amax = std::max(amax, std::fabs(static_cast<float>(p[r * ld + c])));
    tile_enc = second_level_enc(amax);
  }
  for (int64_t r = 0; r < nr; ++r) {
    float enc = tile_enc;
    if (mode == Scale::Row) {
      // rowmax of x itself (P >= 0, so it equals the max of |x|)
      float rmax = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < nc; ++c) rmax = std::max(rmax, static_cast<float>(p[r * ld + c]));
      enc = second_level_enc(rmax);
    }
    for (int64_t c0 = 0; c0 < ld; c0 += 16) {
      const int64_t n = std::clamp<int64_t>(nc - c0, 0, 16);
      fq_group(p + r * ld + c0, out + r * ld + c0, static_cast<int>(n), enc, mode != Scale::Block, dt);
      for (int64_t c = c0 + n; c < std::min<int64_t>(c0 + 16, ld); ++c) out[r * ld + c] = 0.0;
    }
  }
}

// ---- helpers ------------------------------------------------------------------------------------

Tensor rounded(const Tensor& t, DType dt) {
  Tensor r = t;
  for (double& x : r.data) x = round_dtype(dt, x);
  return r;
}

void check_tensor(const Tensor& t, const char* name) {
  const Shape& s = t.shape;
  if (s.B < 1 || s.H < 1 || s.S < 1 || s.D < 1 ||
      t.data.size() != static_cast<size_t>(s.numel()))
    throw std::invalid_argument(std::string("ref64: tensor ") + name + " has a bad shape or size");
}

// Common shape checks of q [B,Hq,Sq,D], k/v [B,Hkv,Skv,D].
void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  check_tensor(q, "q");
  check_tensor(k, "k");
  check_tensor(v, "v");
  const Shape &sq = q.shape, &sk = k.shape, &sv = v.shape;
  if (sk.B != sq.B || sv.B != sq.B || sk.D != sq.D || sv.D != sq.D || sk.H != sv.H ||
      sk.S != sv.S || sq.H % sk.H != 0)
    throw std::invalid_argument("ref64: q, k, v shapes disagree");
}

void check_like(const Tensor& t, const Shape& s, const char* name) {
  check_tensor(t, name);
  if (t.shape.B != s.B || t.shape.H != s.H || t.shape.S != s.S || t.shape.D != s.D)
    throw std::invalid_argument(std::string("ref64: ") + name + " has the wrong shape");
}

double resolve_scale(double s, int64_t D) { return s > 0.0 ? s : 1.0 / std::sqrt(static_cast<double>(D)); }

// Transposes rows [n][D] into out[D][ld] (zero-padding columns n..ld-1), so the inner loops below
// run over contiguous keys and vectorize without reassociating any sum.
void transpose(const double* x, int64_t n, int64_t D, int64_t ld, double* out) {
  for (int64_t d = 0; d < D; ++d) {
    for (int64_t c = 0; c < n; ++c) out[d * ld + c] = x[c * D + d];
    for (int64_t c = n; c < ld; ++c) out[d * ld + c] = 0.0;
  }
}

// s[r][c] = a[r] . b[c] for r < nr, c < ld, where bt is b transposed [D][ld].
void matmul_abt(const double* a, int64_t nr, const double* bt, int64_t ld, int64_t D, double* s) {
  for (int64_t r = 0; r < nr; ++r) {
    double* sr = s + r * ld;
    for (int64_t c = 0; c < ld; ++c) sr[c] = 0.0;
    const double* ar = a + r * D;
    for (int64_t d = 0; d < D; ++d) {
      const double av = ar[d];
      const double* bd = bt + d * ld;
      for (int64_t c = 0; c < ld; ++c) sr[c] += av * bd[c];
    }
  }
}

// out[r][:] (+)= sum_c w[r][c] * b[c][:]  (w [nr][ld], b [nc][D]).
void matmul_wb_acc(const double* w, int64_t nr, int64_t nc, int64_t ld, const double* b, int64_t D,
                   double* out) {
  for (int64_t r = 0; r < nr; ++r) {
    double* o = out + r * D;
    for (int64_t c = 0; c < nc; ++c) {
      const double wv = w[r * ld + c];
      if (wv == 0.0) continue;
      const double* bc = b + c * D;
      for (int64_t d = 0; d < D; ++d) o[d] += wv * bc[d];
    }
  }
}

// out[c][:] += sum_r w[r][c] * a[r][:]  (the transposed product: dV = P^T dO, dK = dS^T Q).
void matmul_wtb_acc(const double* w, int64_t nr, int64_t nc, int64_t ld, const double* a, int64_t D,
                    double* out) {
  for (int64_t c = 0; c < nc; ++c) {
    double* o = out + c * D;
    for (int64_t r = 0; r < nr; ++r) {
      const double wv = w[r * ld + c];
      if (wv == 0.0) continue;
      const double* ar = a + r * D;
      for (int64_t d = 0; d < D; ++d) o[d] += wv * ar[d];
    }
  }
}

size_t off(const Shape& s, int64_t b, int64_t h) {
  return static_cast<size_t>((b * s.H + h) * s.S * s.D);
}

}  // namespace

// ---- scalar roundings ------------------------------------------------------------------------------

double round_bf16(double x) {
  const double r = round_format(x, 7, -126);
  // 0x1.FEp127 is bf16's largest finite value; anything rounding past it is out of range.
  if (std::fabs(r) > 0x1.FEp127) return std::copysign(kInf, x);
  return r;
}

double round_f16(double x) {
  const double r = round_format(x, 10, -14);
  if (std::fabs(r) > 65504.0) return std::copysign(kInf, x);
  return r;
}

double round_dtype(DType dt, double x) { return dt == DType::BF16 ? round_bf16(x) : round_f16(x); }

double round_e4m3(double x) {
  if (std::isnan(x)) return x;
  if (std::isinf(x)) return std::copysign(448.0, x);  // satfinite
  const double r = round_format(std::fabs(x), 3, -6);
  return std::copysign(std::min(r, 448.0), x);
}

double round_e2m1(double x) {
  if (!std::isfinite(x)) return std::copysign(6.0, x);  // Inf/NaN saturate to +-6
  const double r = round_format(std::fabs(x), 1, 0);
  return std::copysign(std::min(r, 6.0), x);
}

// ---- section 1 ----------------------------------------------------------------------------------------

Tensor nvfp4_fake_quantize(const Tensor& x_in, DType dt, Scale mode, int64_t tile_tokens) {
  check_tensor(x_in, "x");
  const Shape s = x_in.shape;
  if (s.D % 16 != 0) throw std::invalid_argument("ref64: nvfp4 needs D a multiple of 16");
  if (mode == Scale::Row) throw std::invalid_argument("ref64: row scales are for P only");
  if (mode == Scale::Tile && tile_tokens < 1) throw std::invalid_argument("ref64: tile_tokens < 1");
  const Tensor x = rounded(x_in, dt);
  Tensor y(s);
  const int64_t tt = mode == Scale::Tile ? tile_tokens : s.S;
  parallel_for(s.B * s.H, [&](int64_t bh) {
    const size_t base = static_cast<size_t>(bh * s.S * s.D);
    for (int64_t t0 = 0; t0 < s.S; t0 += tt) {
      const int64_t n = std::min(tt, s.S - t0);
      fq_rows(x.data.data() + base + t0 * s.D, y.data.data() + base + t0 * s.D, n, s.D, mode, dt);
    }
  });
  return y;
}

// ---- section 2 ----------------------------------------------------------------------------------------

QatInputs qat_prepare(const QatConfig& cfg, DType dt, const Tensor& q_in, const Tensor& k_in,
                      const Tensor& v_in) {
  check_qkv(q_in, k_in, v_in);
  if (cfg.qkv_scale == Scale::Row) throw std::invalid_argument("ref64: qkv_scale cannot be Row");
  if (cfg.quantize && q_in.shape.D % 16 != 0) throw std::invalid_argument("ref64: D % 16 != 0");
  QatInputs in;
  in.q = rounded(q_in, dt);
  in.kk = rounded(k_in, dt);
  in.v = rounded(v_in, dt);
  const Shape ks = in.kk.shape;
  in.kmean.assign(static_cast<size_t>(ks.D), 0.0);
  if (cfg.smooth_k) {
    // Per-channel mean over (B, Hkv, Skv), rounded to the dtype (FastVideo's k.mean() is a bf16
    // tensor), then k - mean rounded again (a bf16 subtraction).
    const int64_t rows = ks.rows();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < ks.D; ++d) in.kmean[d] += in.kk.data[r * ks.D + d];
    for (double& m : in.kmean) m = round_dtype(dt, m / static_cast<double>(rows));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < ks.D; ++d)
        in.kk.data[r * ks.D + d] = round_dtype(dt, in.kk.data[r * ks.D + d] - in.kmean[d]);
  }
  if (cfg.quantize) {
    in.fq = nvfp4_fake_quantize(in.q, dt, cfg.qkv_scale, kQatTile);
    in.fk = nvfp4_fake_quantize(in.kk, dt, cfg.qkv_scale, kQatTile);
    in.fv = nvfp4_fake_quantize(in.v, dt, cfg.qkv_scale, kQatTile);
  } else {
    in.fq = in.q;
    in.fk = in.kk;
    in.fv = in.v;
  }
  return in;
}

QatForward qat_forward(const QatConfig& cfg, DType dt, const Tensor& q, const Tensor& k,
                       const Tensor& v) {
  return qat_forward(cfg, dt, qat_prepare(cfg, dt, q, k, v));
}

QatForward qat_forward(const QatConfig& cfg, DType dt, const QatInputs& in) {
  check_qkv(in.fq, in.fk, in.fv);
  const Shape qs = in.fq.shape, ks = in.fk.shape;
  const int64_t D = qs.D, Sq = qs.S, Skv = ks.S, group = qs.H / ks.H;
  const double scale = resolve_scale(cfg.softmax_scale, D);
  const double sl = scale * kLog2e;
  const int64_t T = kQatTile;

  QatForward out;
  out.o = Tensor(qs);
  out.o_hp = Tensor(qs);
  out.lse.assign(static_cast<size_t>(qs.rows()), 0.0);

  parallel_for(qs.B * qs.H, [&](int64_t bh) {
    const int64_t b = bh / qs.H, h = bh % qs.H, hk = h / group;
    const double* Q = in.fq.data.data() + off(qs, b, h);
    const double* K = in.fk.data.data() + off(ks, b, hk);
    const double* V = in.fv.data.data() + off(ks, b, hk);
    double* O = out.o.data.data() + off(qs, b, h);
    double* Ohp = out.o_hp.data.data() + off(qs, b, h);
    double* L = out.lse.data() + (b * qs.H + h) * Sq;

    std::vector<double> kt(static_cast<size_t>(D * T)), s(T * T), p(T * T), pb(T * T), pq(T * T);
    std::vector<double> acc(static_cast<size_t>(T * D)), acc_hp(static_cast<size_t>(T * D));
    std::vector<double> m(T), l(T), mnew(T);
    for (int64_t i0 = 0; i0 < Sq; i0 += T) {
      const int64_t nr = std::min(T, Sq - i0);
      std::fill(m.begin(), m.end(), -kInf);
      std::fill(l.begin(), l.end(), 0.0);
      std::fill(acc.begin(), acc.end(), 0.0);
      std::fill(acc_hp.begin(), acc_hp.end(), 0.0);
      for (int64_t j0 = 0; j0 < Skv; j0 += T) {
        // Causal: a key tile entirely above the diagonal has p == 0 everywhere and leaves m alone.
        if (cfg.causal && j0 > i0 + nr - 1) break;
        const int64_t nc = std::min(T, Skv - j0);
        transpose(K + j0 * D, nc, D, T, kt.data());
        matmul_abt(Q + i0 * D, nr, kt.data(), T, D, s.data());
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t i = i0 + r;
          // Masked keys (past Skv, or j > i when causal) get p = 0 and take no part in the max;
          // the kernels' -1e6 before scaling gives the same zeros for any unmasked row.
          const int64_t vis = cfg.causal ? std::min(nc, std::max<int64_t>(i - j0 + 1, 0)) : nc;
          double mx = -kInf;
          for (int64_t c = 0; c < vis; ++c) mx = std::max(mx, s[r * T + c] * sl);
          mnew[r] = std::max(m[r], mx);
          for (int64_t c = 0; c < T; ++c) {
            const double pv = (c < vis && mnew[r] > -kInf) ? std::exp2(s[r * T + c] * sl - mnew[r]) : 0.0;
            p[r * T + c] = pv;
            pb[r * T + c] = round_dtype(dt, pv);
          }
        }
        if (cfg.quantize)
          fq_p_tile(p.data(), pq.data(), nr, nc, T, cfg.p_scale, dt);
        else
          pq = pb;  // plain attention: the P.V product still takes p in the tensor dtype
        for (int64_t r = 0; r < nr; ++r) {
          // alpha rescales what was accumulated under the old running max (nothing yet: 0).
          const double alpha = m[r] > -kInf ? std::exp2(m[r] - mnew[r]) : 0.0;
          double rs = 0.0;
          // l sums bf16(p) with quantization (the spec's step 3); plain attention sums p itself, as
          // FastVideo's non-QAT path does (its golden lse matches that to 1e-7).
          const double* pl = cfg.quantize ? pb.data() : p.data();
          for (int64_t c = 0; c < T; ++c) rs += pl[r * T + c];
          l[r] = l[r] * alpha + rs;
          m[r] = mnew[r];
          for (int64_t d = 0; d < D; ++d) {
            acc[r * D + d] *= alpha;
            acc_hp[r * D + d] *= alpha;
          }
        }
        matmul_wb_acc(pq.data(), nr, nc, T, V + j0 * D, D, acc.data());
        matmul_wb_acc(pb.data(), nr, nc, T, V + j0 * D, D, acc_hp.data());
      }
      for (int64_t r = 0; r < nr; ++r) {
        const int64_t i = i0 + r;
        for (int64_t d = 0; d < D; ++d) {
          O[i * D + d] = acc[r * D + d] / l[r];
          Ohp[i * D + d] = cfg.quantize ? acc_hp[r * D + d] / l[r] : O[i * D + d];
        }
        L[i] = m[r] + std::log2(l[r]);
      }
    }
  });
  return out;
}

Grads qat_backward(const QatConfig& cfg, DType dt, const Tensor& q, const Tensor& k,
                   const Tensor& v, const Tensor& o_for_bwd_in, const std::vector<double>& lse,
                   const Tensor& dout_in) {
  return qat_backward(cfg, dt, qat_prepare(cfg, dt, q, k, v), o_for_bwd_in, lse, dout_in);
}

Grads qat_backward(const QatConfig& cfg, DType dt, const QatInputs& in, const Tensor& o_for_bwd_in,
                   const std::vector<double>& lse, const Tensor& dout_in) {
  check_qkv(in.fq, in.fk, in.fv);
  check_qkv(in.q, in.kk, in.v);
  if (cfg.smooth_k && in.kmean.size() != static_cast<size_t>(in.kk.shape.D))
    throw std::invalid_argument("ref64: kmean must have D entries with smooth_k");
  const Shape qs = in.fq.shape, ks = in.fk.shape;
  check_like(o_for_bwd_in, qs, "o_for_bwd");
  check_like(dout_in, qs, "dout");
  if (lse.size() != static_cast<size_t>(qs.rows())) throw std::invalid_argument("ref64: lse size");
  const Tensor o_bwd = rounded(o_for_bwd_in, dt);
  const Tensor dout = rounded(dout_in, dt);
  const int64_t D = qs.D, Sq = qs.S, Skv = ks.S, group = qs.H / ks.H;
  const double scale = resolve_scale(cfg.softmax_scale, D);
  const double sl = scale * kLog2e;
  const int64_t T = kQatTile;
  // quantized_qkv_backward off: the backward multiplies the originals (k after smoothing).
  const bool use_fq = cfg.quantize && cfg.quantized_qkv_backward;
  const Tensor& BQ = use_fq ? in.fq : in.q;
  const Tensor& BK = use_fq ? in.fk : in.kk;
  const Tensor& BV = use_fq ? in.fv : in.v;
  const bool quant_p = cfg.quantize && cfg.quantize_p_backward;

  Grads g{Tensor(qs), Tensor(ks), Tensor(ks)};
  // One unit per (b, kv head): it owns dk/dv of that head and dq of the q heads of its group.
  parallel_for(ks.B * ks.H, [&](int64_t bhk) {
    const int64_t b = bhk / ks.H, hk = bhk % ks.H;
    const double* K = BK.data.data() + off(ks, b, hk);
    const double* V = BV.data.data() + off(ks, b, hk);
    double* dK = g.dk.data.data() + off(ks, b, hk);
    double* dV = g.dv.data.data() + off(ks, b, hk);
    std::vector<double> kt(static_cast<size_t>(D * T)), vt(static_cast<size_t>(D * T));
    std::vector<double> s(T * T), p(T * T), pv(T * T), dp(T * T), ds(T * T), delta(T);
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      const double* Q = BQ.data.data() + off(qs, b, h);
      const double* Ob = o_bwd.data.data() + off(qs, b, h);
      const double* dO = dout.data.data() + off(qs, b, h);
      const double* Lse = lse.data() + (b * qs.H + h) * Sq;
      double* dQ = g.dq.data.data() + off(qs, b, h);
      for (int64_t i0 = 0; i0 < Sq; i0 += T) {
        const int64_t nr = std::min(T, Sq - i0);
        for (int64_t r = 0; r < nr; ++r) {
          double acc = 0.0;
          for (int64_t d = 0; d < D; ++d) acc += Ob[(i0 + r) * D + d] * dO[(i0 + r) * D + d];
          delta[r] = acc;
        }
        for (int64_t j0 = 0; j0 < Skv; j0 += T) {
          if (cfg.causal && j0 > i0 + nr - 1) break;  // P == 0 on the whole tile
          const int64_t nc = std::min(T, Skv - j0);
          transpose(K + j0 * D, nc, D, T, kt.data());
          transpose(V + j0 * D, nc, D, T, vt.data());
          matmul_abt(Q + i0 * D, nr, kt.data(), T, D, s.data());
          matmul_abt(dO + i0 * D, nr, vt.data(), T, D, dp.data());
          for (int64_t r = 0; r < nr; ++r) {
            const int64_t i = i0 + r;
            const int64_t vis = cfg.causal ? std::min(nc, std::max<int64_t>(i - j0 + 1, 0)) : nc;
            for (int64_t c = 0; c < T; ++c)
              p[r * T + c] = (c < vis && Lse[i] > -kInf) ? std::exp2(s[r * T + c] * sl - Lse[i]) : 0.0;
          }
          // dV's P: FQ_P of the normalized P, or P itself, in the dtype either way.
          if (quant_p) {
            fq_p_tile(p.data(), pv.data(), nr, nc, T, cfg.p_scale, dt);
          } else {
            for (int64_t x = 0; x < nr * T; ++x) pv[x] = round_dtype(dt, p[x]);
          }
          matmul_wtb_acc(pv.data(), nr, nc, T, dO + i0 * D, D, dV + j0 * D);
          for (int64_t r = 0; r < nr; ++r)
            for (int64_t c = 0; c < T; ++c) {
              const double x = p[r * T + c] * (dp[r * T + c] - delta[r]);
              ds[r * T + c] = c < nc ? round_dtype(dt, x) : 0.0;
            }
          matmul_wb_acc(ds.data(), nr, nc, T, K + j0 * D, D, dQ + i0 * D);
          matmul_wtb_acc(ds.data(), nr, nc, T, Q + i0 * D, D, dK + j0 * D);
          if (cfg.smooth_k) {
            // d(q.(kk+mean)) / dq: the mean's share, scale*rowsum(dS)*mean, added with dS*fk.
            for (int64_t r = 0; r < nr; ++r) {
              double rs = 0.0;
              for (int64_t c = 0; c < nc; ++c) rs += ds[r * T + c];
              for (int64_t d = 0; d < D; ++d) dQ[(i0 + r) * D + d] += rs * in.kmean[d];
            }
          }
        }
      }
      for (int64_t x = 0; x < Sq * D; ++x) dQ[x] *= scale;
    }
    for (int64_t x = 0; x < Skv * D; ++x) dK[x] *= scale;
  });
  return g;
}

// ---- section 3 ----------------------------------------------------------------------------------------

namespace {

void check_vsa(const Tensor& q, const Tensor& k, const Tensor& v, const VsaIndex& idx) {
  check_qkv(q, k, v);
  if (q.shape.S % kVsaBlock != 0 || k.shape.S % kVsaBlock != 0)
    throw std::invalid_argument("ref64: VSA sequence lengths must be multiples of 64");
  const int64_t nq = q.shape.S / kVsaBlock, nkv = k.shape.S / kVsaBlock;
  if (idx.B != q.shape.B || idx.H != q.shape.H || idx.num_q_blocks != nq || idx.max_k < 1 ||
      idx.q2k_idx.size() != static_cast<size_t>(idx.B * idx.H * nq * idx.max_k) ||
      idx.q2k_num.size() != static_cast<size_t>(idx.B * idx.H * nq) ||
      idx.block_sizes.size() != static_cast<size_t>(nkv))
    throw std::invalid_argument("ref64: VSA metadata shapes disagree with q/k");
}

// The kv blocks q block qb of (b, h) reads, in list order: count clamped to [0, max_k], entries
// outside [0, nkv) skipped.
std::vector<int64_t> listed_blocks(const VsaIndex& idx, int64_t b, int64_t h, int64_t qb,
                                   int64_t nkv) {
  const int64_t row = (b * idx.H + h) * idx.num_q_blocks + qb;
  const int64_t n = std::clamp<int64_t>(idx.q2k_num[row], 0, idx.max_k);
  std::vector<int64_t> out;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t kb = idx.q2k_idx[row * idx.max_k + t];
    if (kb >= 0 && kb < nkv) out.push_back(kb);
  }
  return out;
}

int64_t block_len(const VsaIndex& idx, int64_t kb) {
  return std::clamp<int64_t>(idx.block_sizes[kb], 0, kVsaBlock);
}

}  // namespace

VsaForward vsa_forward(const VsaConfig& cfg, DType dt, const Tensor& q_in, const Tensor& k_in,
                       const Tensor& v_in, const VsaIndex& idx) {
  check_vsa(q_in, k_in, v_in, idx);
  const Tensor q = rounded(q_in, dt), k = rounded(k_in, dt), v = rounded(v_in, dt);
  const Shape qs = q.shape, ks = k.shape;
  const int64_t D = qs.D, nq = qs.S / kVsaBlock, nkv = ks.S / kVsaBlock, group = qs.H / ks.H;
  const double sl = resolve_scale(cfg.softmax_scale, D) * kLog2e;
  constexpr int64_t T = kVsaBlock;
  VsaForward out;
  out.o = Tensor(qs);
  out.lse.assign(static_cast<size_t>(qs.rows()), 0.0);

  parallel_for(qs.B * qs.H, [&](int64_t bh) {
    const int64_t b = bh / qs.H, h = bh % qs.H, hk = h / group;
    const double* Q = q.data.data() + off(qs, b, h);
    const double* K = k.data.data() + off(ks, b, hk);
    const double* V = v.data.data() + off(ks, b, hk);
    double* O = out.o.data.data() + off(qs, b, h);
    double* L = out.lse.data() + (b * qs.H + h) * qs.S;
    std::vector<double> kt(static_cast<size_t>(D * T));
    for (int64_t qb = 0; qb < nq; ++qb) {
      const std::vector<int64_t> blocks = listed_blocks(idx, b, h, qb, nkv);
      const int64_t nb = static_cast<int64_t>(blocks.size());
      // x[r][t*64 + c]: scaled base-2 logits of every listed key, masked slots -inf.
      std::vector<double> x(static_cast<size_t>(T * nb * T), -kInf), s(T * T);
      for (int64_t t = 0; t < nb; ++t) {
        const int64_t kb = blocks[t], n = block_len(idx, kb);
        if (n == 0) continue;
        transpose(K + kb * T * D, n, D, T, kt.data());
        matmul_abt(Q + qb * T * D, T, kt.data(), T, D, s.data());
        for (int64_t r = 0; r < T; ++r)
          for (int64_t c = 0; c < n; ++c) x[r * nb * T + t * T + c] = s[r * T + c] * sl;
      }
      for (int64_t r = 0; r < T; ++r) {
        const int64_t i = qb * T + r;
        const double* xr = x.data() + r * nb * T;
        double mx = -kInf;
        for (int64_t c = 0; c < nb * T; ++c) mx = std::max(mx, xr[c]);
        double* orow = O + i * D;
        std::fill(orow, orow + D, 0.0);
        if (mx == -kInf) {  // nothing visible: o = 0, lse = -inf, by definition
          L[i] = -kInf;
          continue;
        }
        double l = 0.0;
        for (int64_t t = 0; t < nb; ++t) {
          const int64_t kb = blocks[t], n = block_len(idx, kb);
          for (int64_t c = 0; c < n; ++c) {
            const double pv = std::exp2(xr[t * T + c] - mx);
            l += pv;
            const double* vr = V + (kb * T + c) * D;
            for (int64_t d = 0; d < D; ++d) orow[d] += pv * vr[d];
          }
        }
        for (int64_t d = 0; d < D; ++d) orow[d] /= l;
        L[i] = mx + std::log2(l);
      }
    }
  });
  return out;
}

Grads vsa_backward(const VsaConfig& cfg, DType dt, const Tensor& q_in, const Tensor& k_in,
                   const Tensor& v_in, const Tensor& o_in, const std::vector<double>& lse,
                   const Tensor& dout_in, const VsaIndex& idx) {
  check_vsa(q_in, k_in, v_in, idx);
  check_like(o_in, q_in.shape, "o");
  check_like(dout_in, q_in.shape, "dout");
  if (lse.size() != static_cast<size_t>(q_in.shape.rows())) throw std::invalid_argument("ref64: lse size");
  const Tensor q = rounded(q_in, dt), k = rounded(k_in, dt), v = rounded(v_in, dt);
  const Tensor o = rounded(o_in, dt), dout = rounded(dout_in, dt);
  const Shape qs = q.shape, ks = k.shape;
  const int64_t D = qs.D, nq = qs.S / kVsaBlock, nkv = ks.S / kVsaBlock, group = qs.H / ks.H;
  const double scale = resolve_scale(cfg.softmax_scale, D);
  const double sl = scale * kLog2e;
  constexpr int64_t T = kVsaBlock;
  Grads g{Tensor(qs), Tensor(ks), Tensor(ks)};

  parallel_for(ks.B * ks.H, [&](int64_t bhk) {
    const int64_t b = bhk / ks.H, hk = bhk % ks.H;
    const double* K = k.data.data() + off(ks, b, hk);
    const double* V = v.data.data() + off(ks, b, hk);
    double* dK = g.dk.data.data() + off(ks, b, hk);
    double* dV = g.dv.data.data() + off(ks, b, hk);
    std::vector<double> kt(static_cast<size_t>(D * T)), vt(static_cast<size_t>(D * T));
    std::vector<double> s(T * T), dp(T * T), p(T * T), ds(T * T), delta(T);
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      const double* Q = q.data.data() + off(qs, b, h);
      const double* Oo = o.data.data() + off(qs, b, h);
      const double* dO = dout.data.data() + off(qs, b, h);
      const double* Lse = lse.data() + (b * qs.H + h) * qs.S;
      double* dQ = g.dq.data.data() + off(qs, b, h);
      for (int64_t qb = 0; qb < nq; ++qb) {
        const int64_t i0 = qb * T;
        for (int64_t r = 0; r < T; ++r) {
          double acc = 0.0;
          for (int64_t d = 0; d < D; ++d) acc += Oo[(i0 + r) * D + d] * dO[(i0 + r) * D + d];
          delta[r] = acc;
        }
        for (int64_t kb : listed_blocks(idx, b, h, qb, nkv)) {
          const int64_t n = block_len(idx, kb);
          if (n == 0) continue;
          transpose(K + kb * T * D, n, D, T, kt.data());
          transpose(V + kb * T * D, n, D, T, vt.data());
          matmul_abt(Q + i0 * D, T, kt.data(), T, D, s.data());
          matmul_abt(dO + i0 * D, T, vt.data(), T, D, dp.data());
          for (int64_t r = 0; r < T; ++r) {
            const double l = Lse[i0 + r];
            for (int64_t c = 0; c < T; ++c) {
              // Masked slots, and rows the forward found empty (lse = -inf), have P = 0.
              const double pv = (c < n && l > -kInf) ? std::exp2(s[r * T + c] * sl - l) : 0.0;
              p[r * T + c] = pv;
              ds[r * T + c] = pv * (dp[r * T + c] - delta[r]);
            }
          }
          matmul_wtb_acc(p.data(), T, n, T, dO + i0 * D, D, dV + kb * T * D);
          matmul_wb_acc(ds.data(), T, n, T, K + kb * T * D, D, dQ + i0 * D);
          matmul_wtb_acc(ds.data(), T, n, T, Q + i0 * D, D, dK + kb * T * D);
        }
      }
      for (int64_t x = 0; x < qs.S * D; ++x) dQ[x] *= scale;
    }
    for (int64_t x = 0; x < ks.S * D; ++x) dK[x] *= scale;
  });
  return g;
}

K2Q vsa_invert_indices(const VsaIndex& idx, int64_t nkv) {
  if (nkv < 1 || idx.max_k < 1 ||
      idx.q2k_idx.size() != static_cast<size_t>(idx.B * idx.H * idx.num_q_blocks * idx.max_k) ||
      idx.q2k_num.size() != static_cast<size_t>(idx.B * idx.H * idx.num_q_blocks))
    throw std::invalid_argument("ref64: VSA metadata shapes are inconsistent");
  const int64_t nq = idx.num_q_blocks;
  K2Q out;
  out.idx.assign(static_cast<size_t>(idx.B * idx.H * nkv * nq), -1);
  out.num.assign(static_cast<size_t>(idx.B * idx.H * nkv), 0);
  for (int64_t b = 0; b < idx.B; ++b)
    for (int64_t h = 0; h < idx.H; ++h) {
      const int64_t bh = b * idx.H + h;
      // Walking q blocks in ascending order and appending each at most once gives ascending,
      // duplicate-free lists.
      for (int64_t qb = 0; qb < nq; ++qb) {
        std::vector<char> seen(static_cast<size_t>(nkv), 0);
        for (int64_t kb : listed_blocks(idx, b, h, qb, nkv)) {
          if (seen[kb]) continue;
          seen[kb] = 1;
          int32_t& n = out.num[bh * nkv + kb];
          out.idx[(bh * nkv + kb) * nq + n] = static_cast<int32_t>(qb);
          ++n;
        }
      }
    }
  return out;
}

}  // namespace ref64
