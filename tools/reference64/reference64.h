// reference64: docs/SPEC.md sections 1-3 and 3b in float64, the oracle of the tests and of `fvattn demo`.
//
// Written independently of the library: it shares no code with src/ or kernels/ and does not include
// fvattn.h, so a misreading of the spec in one is not silently copied into the other. Its own E4M3,
// E2M1, bf16 and fp16 rounding work on doubles (frexp/ldexp/nearbyint), not on bit tricks.
//
// What is float64 and what is not: every product, sum, exp2 and division of the attention math is
// done in double. The roundings the spec makes part of the function are kept, to the tensor dtype
// (bf16 or fp16, a parameter): decoded fake-quantized values, bf16(p), bf16(pq), dS, the smooth_k mean
// and k - mean. Inside the NVFP4 quantizer the spec's scale arithmetic (amax/6*enc, s*dec, r = 1/(s*dec),
// y = x*r, enc = 2688/amax, dec = 1/enc) is done in correctly rounded fp32, because those are fp32
// values in the function (a double r would round a few y differently from the kernels, and the spec
// requires block mode to match FastVideo's fake_q/k/v bit for bit); so is the decode product e2m1*(s*dec)
// before its rounding to the dtype.
//
// Outputs (o, o_hp, dq, dk, dv, lse) are returned in double, not rounded to their storage dtype: the
// tests measure the library's stored values against them. Inputs are rounded to the dtype on entry
// (a no-op for values that are already representable), so the reference sees what the library sees.
//
// Tensors are contiguous [B, H, S, D] (BHSD), index ((b*H + h)*S + s)*D + d.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ref64 {

enum class DType { BF16, F16 };

// Second-level scale modes (SPEC section 1). Values equal the library's FVA_SCALE_* on purpose, so
// callers can cast, but nothing here depends on that header.
enum class Scale : int { Block = 0, Tile = 1, Row = 2 };

// ---- scalar roundings (exposed so tests can check them against hand-computed values) -------------
double round_bf16(double x);   // round-to-nearest-even, subnormals kept, overflow to +-inf
double round_f16(double x);    // ditto for IEEE binary16
double round_dtype(DType dt, double x);
double round_e4m3(double x);   // RNE to FP8 E4M3, saturating at +-448, subnormals (2^-9 step) kept
double round_e2m1(double x);   // RNE to FP4 E2M1 magnitudes {0,.5,1,1.5,2,3,4,6}, saturating at +-6;
                               // Inf/NaN give +-6

struct Shape {
  int64_t B = 0, H = 0, S = 0, D = 0;
  int64_t numel() const { return B * H * S * D; }
  int64_t rows() const { return B * H * S; }
};

struct Tensor {
  Shape shape;
  std::vector<double> data;  // contiguous BHSD, size shape.numel()

  Tensor() = default;
  explicit Tensor(Shape s) : shape(s), data(static_cast<size_t>(s.numel()), 0.0) {}
  double& at(int64_t b, int64_t h, int64_t s, int64_t d) {
    return data[static_cast<size_t>(((b * shape.H + h) * shape.S + s) * shape.D + d)];
  }
  double at(int64_t b, int64_t h, int64_t s, int64_t d) const {
    return data[static_cast<size_t>(((b * shape.H + h) * shape.S + s) * shape.D + d)];
  }
};

// ---- section 1: NVFP4 fake quantization ---------------------------------------------------------

// y = FQ(x) in groups of 16 along D (D a multiple of 16). Block mode: enc = 1. Tile mode: one enc per
// `tile_tokens` consecutive tokens of each (b, h), counted from s = 0 (the last tile may be shorter;
// tokens past S take no part). Result values are rounded to dt.
Tensor nvfp4_fake_quantize(const Tensor& x, DType dt, Scale mode, int64_t tile_tokens = 32);

// ---- section 2: QAT attention -------------------------------------------------------------------

// Mirrors fva_qat_config_t field by field (see SPEC section 2 for the meaning of each).
struct QatConfig {
  double softmax_scale = 0.0;  // 0: 1/sqrt(D)
  bool causal = false;
  bool quantize = true;
  bool smooth_k = false;
  Scale qkv_scale = Scale::Block;  // Block or Tile
  Scale p_scale = Scale::Block;    // Block, Tile or Row
  bool quantize_p_backward = true;
  bool high_precision_o = true;
  bool quantized_qkv_backward = true;
};

// The tile geometry the reference uses: 32 tokens per Q/K/V scale tile, P tiles of 32 query rows by
// 32 keys (FastVideo's legacy forward and backward tiles). Only tile/row P scales depend on the
// row count; the online-softmax result depends (slightly) on the key-tile width.
constexpr int64_t kQatTile = 32;

// What attention actually multiplies. q, kk, v are the inputs rounded to the dtype, kk = round(k - mean)
// with smooth_k (k itself without); kmean is [D] (zero without smooth_k); fq, fk, fv are their fake
// quantizations (copies of q, kk, v when quantize is off).
struct QatInputs {
  Tensor q, kk, v;
  Tensor fq, fk, fv;
  std::vector<double> kmean;
};
QatInputs qat_prepare(const QatConfig& cfg, DType dt, const Tensor& q, const Tensor& k,
                      const Tensor& v);

struct QatForward {
  Tensor o;     // acc / l
  Tensor o_hp;  // acc_hp / l; equals o when quantize is off
  std::vector<double> lse;  // [B, Hq, Sq], base 2
};
// q [B, Hq, Sq, D], k and v [B, Hkv, Skv, D] with Hq a multiple of Hkv; q head h uses kv head
// h / (Hq / Hkv). Throws std::invalid_argument on inconsistent shapes.
QatForward qat_forward(const QatConfig& cfg, DType dt, const Tensor& q, const Tensor& k,
                       const Tensor& v);
// The same from prepared inputs (qat_prepare's, or ones a test substitutes, e.g. golden fake_q/k/v,
// to separate the attention math from the quantizer).
QatForward qat_forward(const QatConfig& cfg, DType dt, const QatInputs& in);

struct Grads {
  Tensor dq, dk, dv;
};
// Stateless backward: o_for_bwd is o_hp (high_precision_o) or o, lse the forward's, dout the incoming
// gradient. dk and dv are summed over the q heads of each kv group.
Grads qat_backward(const QatConfig& cfg, DType dt, const Tensor& q, const Tensor& k,
                   const Tensor& v, const Tensor& o_for_bwd, const std::vector<double>& lse,
                   const Tensor& dout);
Grads qat_backward(const QatConfig& cfg, DType dt, const QatInputs& in, const Tensor& o_for_bwd,
                   const std::vector<double>& lse, const Tensor& dout);

// ---- section 3: VSA block-sparse attention --------------------------------------------------------

constexpr int64_t kVsaBlock = 64;

struct VsaConfig {
  double softmax_scale = 0.0;  // 0: 1/sqrt(D)
};

// Block-sparse metadata exactly as the API takes it. q2k_idx [B, Hq, nq, max_k], q2k_num [B, Hq, nq],
// block_sizes [nkv]; read as SPEC says: count clamped to [0, max_k], entries outside [0, nkv) skipped,
// sizes clamped to [0, 64].
struct VsaIndex {
  int64_t B = 0, H = 0, num_q_blocks = 0, max_k = 0;
  std::vector<int32_t> q2k_idx;
  std::vector<int32_t> q2k_num;
  std::vector<int32_t> block_sizes;
};

struct VsaForward {
  Tensor o;
  std::vector<double> lse;  // -inf for rows that see no key (their o is 0)
};
// Works in double as well (the spec names no intermediate rounding for VSA). Attention tensors may be
// any dtype; inputs are rounded to dt on entry like QAT's.
VsaForward vsa_forward(const VsaConfig& cfg, DType dt, const Tensor& q, const Tensor& k,
                       const Tensor& v, const VsaIndex& idx);
Grads vsa_backward(const VsaConfig& cfg, DType dt, const Tensor& q, const Tensor& k,
                   const Tensor& v, const Tensor& o, const std::vector<double>& lse,
                   const Tensor& dout, const VsaIndex& idx);

struct K2Q {
  std::vector<int32_t> idx;  // [B, H, nkv, nq]: ascending q blocks, each once, then -1
  std::vector<int32_t> num;  // [B, H, nkv]
};
K2Q vsa_invert_indices(const VsaIndex& idx, int64_t num_kv_blocks);

// ---- section 3b: the whole VSA layer (reference64_vsa_layer.cpp) -----------------------------------

struct VsaLayerConfig {
  double softmax_scale = 0.0;  // 0: scores are divided by sqrt(D), as SPEC 3b writes them
  int64_t topk = 1;            // >= 1
};

// The layer's inputs: q [B, Hq, 64 nq, D], k and v [B, Hkv, 64 nkv, D], gate like q when has_gate,
// block sizes [nq] and [nkv] (clamped to [0, 64]).
struct VsaLayerInputs {
  Tensor q, k, v, gate;
  bool has_gate = false;
  std::vector<int32_t> q_block_sizes, kv_block_sizes;
};

// Selected lists: q2k_idx [B, Hq, nq, k] with k = min(topk, nkv), ascending, -1 past q2k_num.
struct VsaLayerSelection {
  int64_t k = 0;
  std::vector<int32_t> q2k_idx, q2k_num;
};

// The forward's values. What SPEC 3b rounds is rounded to the dtype (the block means, both
// roundings of the scores, attn, out_c); the rest (out_s, out) is double.
struct VsaLayerForward {
  Tensor q_c, k_c, v_c;         // [B, H, n, D]
  std::vector<double> scores;   // [B, Hq, nq, nkv]; -inf for kv blocks of size 0
  std::vector<double> attn;     // [B, Hq, nq, nkv]; 0 for kv blocks of size 0
  Tensor out_c;                 // [B, Hq, nq, D]
  VsaLayerSelection selection;  // the one the fine branch used
  VsaForward fine;              // out_s and its lse
  Tensor out;                   // out_c[block] * gate + out_s (or out_c[block] + out_s)
};

// The selection SPEC 3b defines for these scores: the topk kv blocks of nonzero size with the
// highest scores, ties to the lower index, ascending.
VsaLayerSelection vsa_layer_select(const std::vector<double>& scores, int64_t B, int64_t H,
                                   int64_t nq, const std::vector<int32_t>& kv_block_sizes,
                                   int64_t topk);

// One dtype step (unit in the last place) at magnitude x: the width of a tie of 16-bit scores.
double dtype_step(DType dt, double x);

// How a selection made elsewhere (idx [rows, k], num [rows]; k = min(topk, nkv)) compares with
// `want` (default: the one SPEC 3b defines for `scores`, [rows, nkv] float64): rows that differ yet
// are allowed, because the k-th and (k+1)-th scores lie within one dtype step and the choice stays
// inside that band (a different summation order may round a score across it), and rows that are
// wrong, with the first one's reason.
struct SelectionCheck {
  int64_t tie_rows = 0, bad_rows = 0;
  std::string first_bad;
};
SelectionCheck check_selection(DType dt, const std::vector<int32_t>& idx,
                               const std::vector<int32_t>& num, const std::vector<double>& scores,
                               const std::vector<int32_t>& kv_block_sizes, int64_t rows, int64_t topk,
                               const VsaLayerSelection* want = nullptr);

// `use` replaces the reference's own selection in the fine branch (a test checks first that a
// library's selection is one SPEC 3b allows, then compares everything else on equal terms).
VsaLayerForward vsa_layer_forward(const VsaLayerConfig& cfg, DType dt, const VsaLayerInputs& in,
                                  const VsaLayerSelection* use = nullptr);

struct VsaLayerGrads {
  Tensor dq, dk, dv, dgate;  // dgate only with a gate
};
// The exact gradient of the forward above (in double, from its rounded values), the selection not
// differentiated; with GQA, dk and dv sum over each kv head's group.
VsaLayerGrads vsa_layer_backward(const VsaLayerConfig& cfg, DType dt, const VsaLayerInputs& in,
                                 const VsaLayerForward& fwd, const Tensor& dout);

}  // namespace ref64
