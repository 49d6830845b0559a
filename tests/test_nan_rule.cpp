// The NaN rule (docs/SPEC-notes.md, "NaN and Inf"): a NaN in an input reaches every output it
// touches, in every op and on every backend, so a training loop notices divergence. A row whose
// logits are NaN is not an empty row: VSA gives it NaN, not o = 0 and lse = -inf (an empty row, a
// q block with no visible key, still gets o = 0 and lse = -inf). The one exception is FastVideo's
// own: its NVFP4 quantizer maps a NaN input element to a finite value, so the quantized QAT
// attention returns finite numbers where plain attention returns NaN.
// Each case runs on every backend available (CPU always, CUDA where there is a device), with one
// NaN placed in one input, and checks which outputs are NaN and which stay finite.
#include <doctest/doctest.h>
#include <fvattn/fvattn.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "support/backends.h"
#include "support/host_tensor.h"

namespace {

using fvt::Backend;
using fvt::BackendBuffer;
using fvt::BackendTensor;
using fvt::HostTensor;

constexpr int32_t kDtype = FVA_DTYPE_BF16;
constexpr int64_t D = 64;
const double kNaN = std::numeric_limits<double>::quiet_NaN();

// Runs calls on backend b: uploads the host tensors it is given, downloads the outputs after.
class Session {
 public:
  explicit Session(Backend& b) : b_(b) {}
  const fva_tensor_t* in(const HostTensor& t) {
    tensors_.push_back(std::make_unique<BackendTensor>(b_, t));
    return tensors_.back()->t();
  }
  const fva_tensor_t* out(HostTensor& t) {
    outs_.push_back(&t);
    out_tensors_.push_back(std::make_unique<BackendTensor>(b_, t));
    return out_tensors_.back()->t();
  }
  void* workspace(size_t n) {
    buffers_.push_back(std::make_unique<BackendBuffer>(b_, n));
    return n ? buffers_.back()->data() : nullptr;
  }
  void finish() {
    b_.synchronize();
    for (size_t i = 0; i < outs_.size(); ++i) out_tensors_[i]->download_into(*outs_[i]);
  }
  fva_handle_t h() const { return b_.handle(); }

 private:
  Backend& b_;
  std::vector<std::unique_ptr<BackendTensor>> tensors_, out_tensors_;
  std::vector<HostTensor*> outs_;
  std::vector<std::unique_ptr<BackendBuffer>> buffers_;
};

// False (with a message) when the backend has no kernel for the call.
bool ok_or_skip(const Backend& b, fva_status_t st, const char* what) {
  if (fvt::skip_unsupported(b, st, what)) return false;
  REQUIRE_MESSAGE(st == FVA_OK, b.name() << ": " << what << " -> " << std::string(fva_status_string(st))
                                         << ": " << std::string(fva_last_error()));
  return true;
}

HostTensor normal(std::vector<int64_t> shape, std::mt19937_64& rng) {
  HostTensor t(kDtype, std::move(shape));
  t.fill_normal(rng);
  return t;
}

// x with element (b, h, s, d) set to NaN.
void put_nan(HostTensor& x, int64_t h, int64_t s, int64_t d) {
  std::vector<double> v = x.values();
  const auto& sh = x.shape();
  v[static_cast<size_t>((h * sh[2] + s) * sh[3] + d)] = kNaN;
  x.fill(v);
}

// Rows [s0, s1) of head h of a [1, H, S, D] (or [1, H, S]) tensor: how many are all NaN, and how many
// hold a NaN at all.
struct RowCount {
  int64_t all_nan = 0, any_nan = 0;
};
RowCount count_rows(const HostTensor& x, int64_t h, int64_t s0, int64_t s1) {
  const std::vector<double> v = x.values();
  const auto& sh = x.shape();
  const int64_t S = sh[2], W = sh.size() == 4 ? sh[3] : 1;
  RowCount c;
  for (int64_t s = s0; s < s1; ++s) {
    int64_t nan = 0;
    for (int64_t d = 0; d < W; ++d) nan += std::isnan(v[static_cast<size_t>((h * S + s) * W + d)]);
    c.all_nan += nan == W;
    c.any_nan += nan > 0;
  }
  return c;
}
bool all_finite_except(const HostTensor& x, int64_t h, int64_t s0, int64_t s1) {
  const std::vector<double> v = x.values();
  const auto& sh = x.shape();
  const int64_t H = sh[1], S = sh[2], W = sh.size() == 4 ? sh[3] : 1;
  for (int64_t hh = 0; hh < H; ++hh)
    for (int64_t s = 0; s < S; ++s) {
      if (hh == h && s >= s0 && s < s1) continue;
      for (int64_t d = 0; d < W; ++d)
        if (!std::isfinite(v[static_cast<size_t>((hh * S + s) * W + d)])) return false;
    }
  return true;
}

// ---- QAT attention ----------------------------------------------------------------------------------

struct QatRun {
  HostTensor o, o_hp, lse, dq, dk, dv;
};
bool run_qat(Backend& b, const fva_qat_config_t& cfg, const HostTensor& q, const HostTensor& k,
             const HostTensor& v, const HostTensor& dout, QatRun* r) {
  const auto& s = q.shape();
  const int64_t H = s[1], S = s[2];
  r->o = HostTensor(kDtype, {1, H, S, D});
  r->o_hp = HostTensor(kDtype, {1, H, S, D});
  r->lse = HostTensor(FVA_DTYPE_F32, {1, H, S});
  r->dq = HostTensor(kDtype, {1, H, S, D});
  r->dk = HostTensor(kDtype, {1, H, S, D});
  r->dv = HostTensor(kDtype, {1, H, S, D});
  Session x(b);
  const fva_tensor_t *tq = x.in(q), *tk = x.in(k), *tv = x.in(v), *tdo = x.in(dout);
  const fva_tensor_t *to = x.out(r->o), *th = x.out(r->o_hp), *tl = x.out(r->lse), *tdq = x.out(r->dq),
                     *tdk = x.out(r->dk), *tdv = x.out(r->dv);
  size_t fb = 0, bb = 0;
  if (!ok_or_skip(b, fva_qat_forward_workspace_size(x.h(), &cfg, tq, tk, tv, &fb), "qat forward size") ||
      !ok_or_skip(b, fva_qat_forward(x.h(), &cfg, tq, tk, tv, to, th, tl, x.workspace(fb), fb, nullptr),
                  "fva_qat_forward") ||
      !ok_or_skip(b, fva_qat_backward_workspace_size(x.h(), &cfg, tq, tk, tv, &bb), "qat backward size") ||
      !ok_or_skip(b, fva_qat_backward(x.h(), &cfg, tq, tk, tv, th, tl, tdo, tdq, tdk, tdv, x.workspace(bb),
                                      bb, nullptr),
                  "fva_qat_backward"))
    return false;
  x.finish();
  return true;
}

TEST_CASE("NaN rule: plain attention carries a NaN in q or k to every output it touches") {
  std::mt19937_64 rng(std::random_device{}());
  constexpr int64_t H = 2, S = 128, r = 37;
  fva_qat_config_t cfg = FVA_QAT_CONFIG_INIT;
  cfg.quantize = 0;
  for (auto& backend : fvt::available_backends()) {
    Backend& b = *backend;
    INFO(b.name());
    HostTensor q = normal({1, H, S, D}, rng), k = normal({1, H, S, D}, rng), v = normal({1, H, S, D}, rng),
               dout = normal({1, H, S, D}, rng);
    SUBCASE("NaN in a row of q") {
      put_nan(q, 1, r, 5);
      QatRun run;
      if (!run_qat(b, cfg, q, k, v, dout, &run)) continue;
      CHECK(count_rows(run.o, 1, r, r + 1).all_nan == 1);
      CHECK(count_rows(run.lse, 1, r, r + 1).all_nan == 1);
      CHECK(all_finite_except(run.o, 1, r, r + 1));  // rows are independent in the forward
      CHECK(count_rows(run.dq, 1, r, r + 1).all_nan == 1);
      CHECK(count_rows(run.dk, 1, 0, S).any_nan > 0);  // every key saw the NaN row
      CHECK(count_rows(run.dv, 1, 0, S).any_nan > 0);
      CHECK(all_finite_except(run.dk, 1, 0, S));  // the other head is untouched
    }
    SUBCASE("NaN in a row of k") {
      put_nan(k, 0, 90, 0);
      QatRun run;
      if (!run_qat(b, cfg, q, k, v, dout, &run)) continue;
      CHECK(count_rows(run.o, 0, 0, S).all_nan == S);  // non-causal: every row sees key 90
      CHECK(count_rows(run.lse, 0, 0, S).all_nan == S);
      CHECK(all_finite_except(run.o, 0, 0, S));
    }
  }
}

TEST_CASE("NaN rule: FastVideo's NVFP4 quantizer maps a NaN to a finite value (the documented exception)") {
  std::mt19937_64 rng(std::random_device{}());
  constexpr int64_t H = 1, S = 128;
  const fva_qat_config_t cfg = FVA_QAT_CONFIG_INIT;  // the production preset: Q, K, V quantized
  for (auto& backend : fvt::available_backends()) {
    Backend& b = *backend;
    INFO(b.name());
    HostTensor q = normal({1, H, S, D}, rng), k = normal({1, H, S, D}, rng), v = normal({1, H, S, D}, rng),
               dout = normal({1, H, S, D}, rng);
    put_nan(q, 0, 11, 7);
    QatRun run;
    if (!run_qat(b, cfg, q, k, v, dout, &run)) continue;
    CHECK(all_finite_except(run.o, 0, 0, 0));
    CHECK(all_finite_except(run.lse, 0, 0, 0));
  }
}

// ---- VSA -------------------------------------------------------------------------------------------

// Two q blocks, three kv blocks: q block 0 lists kv blocks {0, 2}, q block 1 lists {1}; in head 1 q
// block 1 lists nothing (an empty row set: o = 0, lse = -inf).
struct VsaRun {
  HostTensor o, lse, dq, dk, dv;
};
constexpr int64_t kVsaH = 2, kVsaNq = 2, kVsaNkv = 3;
struct VsaLists {
  HostTensor idx{FVA_DTYPE_I32, {1, kVsaH, kVsaNq, 2}}, num{FVA_DTYPE_I32, {1, kVsaH, kVsaNq}},
      sizes{FVA_DTYPE_I32, {kVsaNkv}};
  VsaLists() {
    idx.fill_i32({0, 2, 1, -1, 0, 2, 1, -1});
    num.fill_i32({2, 1, 2, 0});
    sizes.fill_i32({64, 64, 40});
  }
};

// The VSA backward over given o and lse (run_vsa's lists).
bool run_vsa_backward(Backend& b, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                      const HostTensor& o, const HostTensor& lse, const HostTensor& dout, VsaRun* r) {
  constexpr int64_t H = kVsaH, NQ = kVsaNq, NKV = kVsaNkv;
  const VsaLists lists;
  const HostTensor &idx = lists.idx, &num = lists.num, &sizes = lists.sizes;
  r->dq = HostTensor(kDtype, {1, H, 64 * NQ, D});
  r->dk = HostTensor(kDtype, {1, H, 64 * NKV, D});
  r->dv = HostTensor(kDtype, {1, H, 64 * NKV, D});
  Session x(b);
  const fva_tensor_t *tq = x.in(q), *tk = x.in(k), *tv = x.in(v), *to = x.in(o), *tl = x.in(lse),
                     *tdo = x.in(dout), *ti = x.in(idx), *tn = x.in(num), *ts = x.in(sizes);
  const fva_tensor_t *tdq = x.out(r->dq), *tdk = x.out(r->dk), *tdv = x.out(r->dv);
  const fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;
  size_t bb = 0;
  if (!ok_or_skip(b, fva_vsa_backward_workspace_size(x.h(), &cfg, tq, tk, tv, ti, &bb), "vsa backward size") ||
      !ok_or_skip(b, fva_vsa_backward(x.h(), &cfg, tq, tk, tv, to, tl, tdo, ti, tn, ts, tdq, tdk, tdv,
                                      x.workspace(bb), bb, nullptr),
                  "fva_vsa_backward"))
    return false;
  x.finish();
  return true;
}

// The VSA forward, then its backward over the forward's o and lse.
bool run_vsa(Backend& b, const HostTensor& q, const HostTensor& k, const HostTensor& v,
             const HostTensor& dout, VsaRun* r) {
  const VsaLists lists;
  r->o = HostTensor(kDtype, {1, kVsaH, 64 * kVsaNq, D});
  r->lse = HostTensor(FVA_DTYPE_F32, {1, kVsaH, 64 * kVsaNq});
  Session x(b);
  const fva_tensor_t *tq = x.in(q), *tk = x.in(k), *tv = x.in(v), *ti = x.in(lists.idx),
                     *tn = x.in(lists.num), *ts = x.in(lists.sizes);
  const fva_tensor_t *to = x.out(r->o), *tl = x.out(r->lse);
  const fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;
  size_t fb = 0;
  if (!ok_or_skip(b, fva_vsa_forward_workspace_size(x.h(), &cfg, tq, tk, tv, ti, &fb), "vsa forward size") ||
      !ok_or_skip(b, fva_vsa_forward(x.h(), &cfg, tq, tk, tv, ti, tn, ts, to, tl, x.workspace(fb), fb, nullptr),
                  "fva_vsa_forward"))
    return false;
  x.finish();
  return run_vsa_backward(b, q, k, v, r->o, r->lse, dout, r);
}

TEST_CASE("NaN rule: VSA gives a row with a NaN in q NaN outputs, not an empty row's") {
  std::mt19937_64 rng(std::random_device{}());
  constexpr int64_t H = 2;
  for (auto& backend : fvt::available_backends()) {
    Backend& b = *backend;
    INFO(b.name());
    HostTensor q = normal({1, H, 128, D}, rng), k = normal({1, H, 192, D}, rng),
               v = normal({1, H, 192, D}, rng), dout = normal({1, H, 128, D}, rng);
    SUBCASE("NaN in a row of q") {
      put_nan(q, 0, 20, 3);  // q block 0 of head 0
      VsaRun run;
      if (!run_vsa(b, q, k, v, dout, &run)) continue;
      CHECK(count_rows(run.o, 0, 20, 21).all_nan == 1);
      CHECK(count_rows(run.lse, 0, 20, 21).all_nan == 1);
      CHECK(all_finite_except(run.o, 0, 20, 21));
      CHECK(count_rows(run.dq, 0, 20, 21).all_nan == 1);
      CHECK(all_finite_except(run.dq, 0, 20, 21));  // dq rows depend on their own row only
      // kv blocks 0 and 2 of head 0 saw the row: NaN there; kv block 1 did not.
      CHECK(count_rows(run.dk, 0, 0, 64).any_nan > 0);
      CHECK(count_rows(run.dv, 0, 128, 192).any_nan > 0);
      CHECK(count_rows(run.dk, 0, 64, 128).any_nan == 0);
      // The empty q block (head 1, q block 1) keeps o = 0 and lse = -inf.
      const std::vector<double> l = run.lse.values();
      CHECK(std::isinf(l[static_cast<size_t>(128 + 64)]));
      CHECK(l[static_cast<size_t>(128 + 64)] < 0);
    }
    SUBCASE("NaN in a row of q: the whole q row NaN") {
      for (int64_t d = 0; d < D; ++d) put_nan(q, 1, 70, d);  // q block 1 of head 1 lists nothing
      put_nan(q, 1, 5, 0);
      for (int64_t d = 0; d < D; ++d) put_nan(q, 1, 6, d);
      VsaRun run;
      if (!run_vsa(b, q, k, v, dout, &run)) continue;
      CHECK(count_rows(run.o, 1, 5, 7).all_nan == 2);  // every logit NaN is not an empty row
      CHECK(count_rows(run.lse, 1, 5, 7).all_nan == 2);
      // A row of a q block without keys touches nothing: o = 0, lse = -inf whatever q holds.
      CHECK(count_rows(run.o, 1, 70, 71).any_nan == 0);
      CHECK(run.lse.values()[static_cast<size_t>(128 + 70)] == -std::numeric_limits<double>::infinity());
    }
    SUBCASE("NaN in a key of kv block 1") {
      put_nan(k, 0, 64 + 9, 0);
      VsaRun run;
      if (!run_vsa(b, q, k, v, dout, &run)) continue;
      // Head 0: q block 1 lists kv block 1 (NaN rows); q block 0 does not (finite).
      CHECK(count_rows(run.o, 0, 64, 128).all_nan == 64);
      CHECK(count_rows(run.lse, 0, 64, 128).all_nan == 64);
      CHECK(all_finite_except(run.o, 0, 64, 128));
    }
  }
}

// An lse of -inf is the mark of a row that saw no key (what the forward leaves for one): the
// backward takes its P as 0 on every backend, whatever keys its block lists, so its dq row is 0 and
// it adds nothing to dk and dv (not 2^(s + inf) = inf, which would make them NaN). Its dS is 0 by
// selection, not P · (dP - Delta): the test gives those rows an o holding inf, so Delta is inf or
// NaN there.
TEST_CASE("An lse of -inf marks a row that saw no key: the VSA backward gives it P = 0 on every backend") {
  std::mt19937_64 rng(std::random_device{}());
  constexpr int64_t H = 2;
  for (auto& backend : fvt::available_backends()) {
    Backend& b = *backend;
    INFO(b.name());
    const HostTensor q = normal({1, H, 128, D}, rng), k = normal({1, H, 192, D}, rng),
                     v = normal({1, H, 192, D}, rng), dout = normal({1, H, 128, D}, rng);
    VsaRun full;
    if (!run_vsa(b, q, k, v, dout, &full)) continue;
    // Row 20 of head 0 (q block 0, which lists the whole kv block 0 and the ragged block 2), and
    // every row of q block 1 of head 0 (which lists the whole kv block 1).
    std::vector<double> l = full.lse.values();
    l[20] = -std::numeric_limits<double>::infinity();
    for (int64_t s = 64; s < 128; ++s) l[static_cast<size_t>(s)] = -std::numeric_limits<double>::infinity();
    HostTensor lse(FVA_DTYPE_F32, {1, H, 128});
    lse.fill(l);
    std::vector<double> o_values = full.o.values();
    for (int64_t s : {int64_t{20}, int64_t{64}, int64_t{100}, int64_t{127}})
      o_values[static_cast<size_t>(s * D + 3)] = std::numeric_limits<double>::infinity();
    HostTensor o(full.o.dtype(), {1, H, 128, D});
    o.fill(o_values);
    VsaRun run;
    if (!run_vsa_backward(b, q, k, v, o, lse, dout, &run)) continue;
    const std::vector<double> dq = run.dq.values();
    bool zero_rows = true;
    for (int64_t s : {int64_t{20}, int64_t{64}, int64_t{100}, int64_t{127}})
      for (int64_t d = 0; d < D; ++d) zero_rows = zero_rows && dq[static_cast<size_t>(s * D + d)] == 0.0;
    CHECK_MESSAGE(zero_rows, "a row with lse = -inf got a nonzero dq");
    CHECK(all_finite_except(run.dq, 0, 0, 0));
    CHECK(all_finite_except(run.dk, 0, 0, 0));
    CHECK(all_finite_except(run.dv, 0, 0, 0));
    // kv block 1 of head 0 is listed only by q block 1, whose rows all have lse = -inf: dk, dv 0.
    const std::vector<double> dk = run.dk.values(), dv = run.dv.values();
    bool block1_zero = true;
    for (int64_t s = 64; s < 128; ++s)
      for (int64_t d = 0; d < D; ++d)
        block1_zero = block1_zero && dk[static_cast<size_t>(s * D + d)] == 0.0 && dv[static_cast<size_t>(s * D + d)] == 0.0;
    CHECK_MESSAGE(block1_zero, "a kv block seen only by rows with lse = -inf got nonzero dk or dv");
  }
}

// ---- the whole VSA layer ---------------------------------------------------------------------------

TEST_CASE("NaN rule: the VSA layer carries a NaN in q to its block's outputs") {
  std::mt19937_64 rng(std::random_device{}());
  constexpr int64_t H = 1, NB = 4, S = 64 * NB;
  for (auto& backend : fvt::available_backends()) {
    Backend& b = *backend;
    INFO(b.name());
    HostTensor q = normal({1, H, S, D}, rng), k = normal({1, H, S, D}, rng), v = normal({1, H, S, D}, rng),
               gate = normal({1, H, S, D}, rng);
    put_nan(q, 0, 64 * 2 + 7, 1);  // a token of block 2
    HostTensor sizes(FVA_DTYPE_I32, {NB});
    sizes.fill_i32({64, 64, 64, 64});
    HostTensor out(kDtype, {1, H, S, D});
    Session x(b);
    const fva_tensor_t *tq = x.in(q), *tk = x.in(k), *tv = x.in(v), *tg = x.in(gate), *ts = x.in(sizes);
    const fva_tensor_t* to = x.out(out);
    fva_vsa_layer_config_t cfg = FVA_VSA_LAYER_CONFIG_INIT;
    cfg.topk = 2;
    size_t ws = 0, rs = 0;
    if (!ok_or_skip(b, fva_vsa_layer_sizes(x.h(), &cfg, tq, tk, tv, &ws, &rs), "fva_vsa_layer_sizes")) continue;
    void* reserve = x.workspace(rs);
    if (!ok_or_skip(b, fva_vsa_layer_forward(x.h(), &cfg, tq, tk, tv, tg, ts, ts, to, nullptr, nullptr, reserve,
                                             rs, x.workspace(ws), ws, nullptr),
                    "fva_vsa_layer_forward"))
      continue;
    x.finish();
    // Block 2's mean is NaN, so its coarse output is: every row of block 2 is NaN; the NaN row
    // itself also through the fine branch. The other blocks' rows stay finite.
    CHECK(count_rows(out, 0, 128, 192).all_nan == 64);
    CHECK(all_finite_except(out, 0, 128, 192));
  }
}

}  // namespace
