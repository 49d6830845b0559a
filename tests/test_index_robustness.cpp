// VSA metadata that no argument check can see: the contents of q2k_idx, q2k_num and
// block_sizes are never read on the host by a GPU backend, so every backend must survive any values
// there, as fvattn.h documents:
//   - a q2k_idx entry outside [0, num_kv_blocks) is skipped: the result is exactly that of the list
//     without it;
//   - q2k_num is clamped to [0, max_k] (negative counts read nothing, larger ones read max_k);
//   - block_sizes are clamped to [0, 64];
//   - a kv block listed twice counts twice in forward and backward, and once in the k2q inverse.
// Each case runs forward, backward and the index inversion on every backend available (CPU
// always, CUDA where there is a device) with the wild metadata and with its clean equivalent, and
// requires bitwise equal results; duplicates, which have no clean equivalent, are compared with
// reference64. Every buffer has guard bytes on both sides, checked after the calls (and poisoned
// for AddressSanitizer on the CPU); the GPU run is meant for compute-sanitizer memcheck too
// (tools/device/device_check.sh).
#include <doctest/doctest.h>
#include <fvattn/fvattn.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "reference64.h"
#include "support/backends.h"
#include "support/host_tensor.h"
#include "support/reference_bridge.h"

namespace {

using fvt::Backend;
using fvt::BackendBuffer;
using fvt::BackendTensor;
using fvt::HostTensor;

// GQA (two q heads share one kv head), two q blocks, four kv blocks, lists of up to four entries.
constexpr int64_t B = 1, Hq = 2, Hkv = 1, NQ = 2, NKV = 4, MAXK = 4, D = 64;
constexpr int64_t Sq = 64 * NQ, Skv = 64 * NKV;
constexpr int32_t kDtype = FVA_DTYPE_BF16;

// q2k_idx [B, Hq, NQ, MAXK], q2k_num [B, Hq, NQ], block_sizes [NKV], flattened.
struct Meta {
  std::vector<int32_t> idx, num, sizes;
};

struct Inputs {
  HostTensor q{kDtype, {B, Hq, Sq, D}}, k{kDtype, {B, Hkv, Skv, D}}, v{kDtype, {B, Hkv, Skv, D}};
  HostTensor dout{kDtype, {B, Hq, Sq, D}};
  explicit Inputs(std::mt19937_64& rng) {
    for (HostTensor* t : {&q, &k, &v, &dout}) t->fill_normal(rng);
  }
};

// What one backend computed from one set of metadata: raw bytes, for bitwise comparison.
struct Results {
  std::vector<uint8_t> o, lse, dq, dk, dv, k2q_idx, k2q_num;
  std::vector<double> o_values, lse_values, dq_values, dk_values, dv_values;
};

std::vector<uint8_t> bytes_of(const HostTensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  return std::vector<uint8_t>(p, p + t.bytes());
}

// Checks a call's status; false (with a message) when the backend has no kernel for it yet.
bool ok_or_skip(const Backend& b, fva_status_t st, const char* what) {
  if (fvt::skip_unsupported(b, st, what)) return false;
  REQUIRE_MESSAGE(st == FVA_OK, b.name() << ": " << what << " -> " << std::string(fva_status_string(st))
                                         << ": " << std::string(fva_last_error()));
  return true;
}

// Forward, backward (from this forward's o and lse) and the k2q inversion of `m` on backend `b`.
// Outputs start filled with `poison`, so an element a backend forgets to write differs between two
// runs poisoned differently. Returns false when the backend skipped an operation.
bool run_all(Backend& b, const Inputs& in, const Meta& m, uint8_t poison, Results* r) {
  HostTensor idx(FVA_DTYPE_I32, {B, Hq, NQ, MAXK}), num(FVA_DTYPE_I32, {B, Hq, NQ}), sizes(FVA_DTYPE_I32, {NKV});
  idx.fill_i32(m.idx);
  num.fill_i32(m.num);
  sizes.fill_i32(m.sizes);
  HostTensor o(kDtype, {B, Hq, Sq, D}), lse(FVA_DTYPE_F32, {B, Hq, Sq});
  HostTensor dq(kDtype, {B, Hq, Sq, D}), dk(kDtype, {B, Hkv, Skv, D}), dv(kDtype, {B, Hkv, Skv, D});
  HostTensor k2q_idx(FVA_DTYPE_I32, {B, Hq, NKV, NQ}), k2q_num(FVA_DTYPE_I32, {B, Hq, NKV});
  HostTensor* outputs[] = {&o, &lse, &dq, &dk, &dv, &k2q_idx, &k2q_num};
  for (HostTensor* t : outputs) std::memset(t->data(), poison, t->bytes());

  const HostTensor* inputs[] = {&in.q, &in.k, &in.v, &in.dout, &idx, &num, &sizes};
  std::vector<std::unique_ptr<BackendTensor>> ins, outs;
  for (const HostTensor* t : inputs) ins.push_back(std::make_unique<BackendTensor>(b, *t));
  for (const HostTensor* t : outputs) outs.push_back(std::make_unique<BackendTensor>(b, *t));
  const fva_tensor_t *q = ins[0]->t(), *k = ins[1]->t(), *v = ins[2]->t(), *dout = ins[3]->t();
  const fva_tensor_t *q2k_idx = ins[4]->t(), *q2k_num = ins[5]->t(), *bs = ins[6]->t();
  const fva_tensor_t *o_ = outs[0]->t(), *lse_ = outs[1]->t(), *dq_ = outs[2]->t(), *dk_ = outs[3]->t(),
                     *dv_ = outs[4]->t(), *k2q_idx_ = outs[5]->t(), *k2q_num_ = outs[6]->t();

  std::vector<std::unique_ptr<BackendBuffer>> workspaces;
  auto workspace = [&](size_t n) -> void* {
    workspaces.push_back(std::make_unique<BackendBuffer>(b, n));
    return n ? workspaces.back()->data() : nullptr;
  };
  const fva_handle_t h = b.handle();
  const fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;
  size_t bytes = 0;
  if (!ok_or_skip(b, fva_vsa_forward_workspace_size(h, &cfg, q, k, v, q2k_idx, &bytes),
                  "fva_vsa_forward_workspace_size") ||
      !ok_or_skip(b, fva_vsa_forward(h, &cfg, q, k, v, q2k_idx, q2k_num, bs, o_, lse_, workspace(bytes), bytes,
                                     nullptr),
                  "fva_vsa_forward") ||
      !ok_or_skip(b, fva_vsa_backward_workspace_size(h, &cfg, q, k, v, q2k_idx, &bytes),
                  "fva_vsa_backward_workspace_size") ||
      !ok_or_skip(b, fva_vsa_backward(h, &cfg, q, k, v, o_, lse_, dout, q2k_idx, q2k_num, bs, dq_, dk_, dv_,
                                      workspace(bytes), bytes, nullptr),
                  "fva_vsa_backward") ||
      !ok_or_skip(b, fva_vsa_invert_indices_workspace_size(h, q2k_idx, k2q_idx_, &bytes),
                  "fva_vsa_invert_indices_workspace_size") ||
      !ok_or_skip(b, fva_vsa_invert_indices(h, q2k_idx, q2k_num, k2q_idx_, k2q_num_, workspace(bytes), bytes,
                                            nullptr),
                  "fva_vsa_invert_indices"))
    return false;
  b.synchronize();

  for (size_t i = 0; i < ins.size(); ++i) {
    CHECK_MESSAGE(ins[i]->guards_intact(), b.name() << ": a write landed next to input " << i);
    CHECK_MESSAGE(ins[i]->download() == bytes_of(*inputs[i]), b.name() << ": input " << i << " was modified");
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    CHECK_MESSAGE(outs[i]->guards_intact(), b.name() << ": a write landed next to output " << i);
    outs[i]->download_into(*outputs[i]);
  }
  for (auto& w : workspaces) CHECK_MESSAGE(w->guards_intact(), b.name() << ": a write landed next to a workspace");

  r->o = bytes_of(o), r->lse = bytes_of(lse), r->dq = bytes_of(dq), r->dk = bytes_of(dk), r->dv = bytes_of(dv);
  r->k2q_idx = bytes_of(k2q_idx), r->k2q_num = bytes_of(k2q_num);
  r->o_values = o.values(), r->lse_values = lse.values(), r->dq_values = dq.values();
  r->dk_values = dk.values(), r->dv_values = dv.values();
  return true;
}

void require_identical(const Results& wild, const Results& clean, const std::string& what) {
  CHECK_MESSAGE(wild.o == clean.o, what << ": o differs");
  CHECK_MESSAGE(wild.lse == clean.lse, what << ": lse differs");
  CHECK_MESSAGE(wild.dq == clean.dq, what << ": dq differs");
  CHECK_MESSAGE(wild.dk == clean.dk, what << ": dk differs");
  CHECK_MESSAGE(wild.dv == clean.dv, what << ": dv differs");
  CHECK_MESSAGE(wild.k2q_idx == clean.k2q_idx, what << ": k2q_idx differs");
  CHECK_MESSAGE(wild.k2q_num == clean.k2q_num, what << ": k2q_num differs");
}

// A wild set of metadata and what the header says it means.
struct Case {
  const char* name;
  Meta wild, clean;
};

// Valid lists: each (head, q block) row lists distinct in-range blocks, ascending.
Meta valid_meta() {
  Meta m;
  m.idx = {0, 1, 3, 0, /**/ 2, 3, 0, 0, /**/ 1, 0, 0, 0, /**/ 0, 1, 2, 3};
  m.num = {3, 2, 1, 4};
  m.sizes = {64, 40, 17, 64};
  return m;
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  const Meta v = valid_meta();
  {
    Case c{"q2k_idx entries outside [0, num_kv_blocks)", v, v};
    // Out-of-range entries among the read ones; the clean lists drop them. Unread slots (past the
    // count) hold garbage in both.
    c.wild.idx = {-1, 0, NKV, 2, /**/ INT_MAX, 1, INT_MIN, -3, /**/ 3, NKV + 1, 0, 999, /**/ -NKV, -1, NKV, INT_MIN};
    c.wild.num = {4, 4, 3, 4};
    c.clean.idx = {0, 2, 7, 7, /**/ 1, 7, 7, 7, /**/ 3, 0, 7, 7, /**/ 9, 9, 9, 9};
    c.clean.num = {2, 1, 2, 0};
    cs.push_back(c);
  }
  {
    Case c{"negative q2k_num", v, v};
    c.wild.num = {-1, INT_MIN, 1, -4};
    c.clean.num = {0, 0, 1, 0};
    cs.push_back(c);
  }
  {
    Case c{"q2k_num above max_k", v, v};
    c.wild.num = {MAXK + 1, INT_MAX, 4, 1000};
    c.clean.num = {MAXK, MAXK, MAXK, MAXK};
    cs.push_back(c);
  }
  {
    Case c{"block_sizes outside [0, 64]", v, v};
    c.wild.sizes = {-1, 65, INT_MIN, INT_MAX};
    c.clean.sizes = {0, 64, 0, 64};
    cs.push_back(c);
  }
  {
    Case c{"everything at once", v, v};
    c.wild.idx = {NKV, 1, 3, 0, /**/ 2, -2, 0, 0, /**/ 1, 0, 0, 0, /**/ 0, 1, 2, INT_MAX};
    c.wild.num = {3, -7, INT_MAX, 4};
    c.wild.sizes = {100, -40, 17, 64};
    c.clean.idx = {1, 3, 0, 0, /**/ 2, -2, 0, 0, /**/ 1, 0, 0, 0, /**/ 0, 1, 2, 0};
    c.clean.num = {2, 0, 4, 3};
    c.clean.sizes = {64, 0, 17, 64};
    cs.push_back(c);
  }
  return cs;
}

// Duplicated entries: lists that name a kv block more than once.
Meta duplicates_meta() {
  Meta m;
  m.idx = {2, 2, 0, 2, /**/ 1, 1, 1, 1, /**/ 3, 0, 3, 0, /**/ 0, 0, 2, 1};
  m.num = {4, 4, 4, 3};
  m.sizes = {64, 40, 17, 64};
  return m;
}

// The same lists with each kv block once (first occurrence kept): their k2q inverse must equal that
// of the duplicated lists.
Meta deduplicated(const Meta& m) {
  Meta d = m;
  for (int64_t row = 0; row < B * Hq * NQ; ++row) {
    std::vector<int32_t> seen;
    for (int64_t t = 0; t < m.num[row]; ++t) {
      const int32_t kv = m.idx[row * MAXK + t];
      bool dup = false;
      for (int32_t s : seen) dup = dup || s == kv;
      if (!dup) seen.push_back(kv);
    }
    for (size_t t = 0; t < seen.size(); ++t) d.idx[row * MAXK + static_cast<int64_t>(t)] = seen[t];
    d.num[row] = static_cast<int32_t>(seen.size());
  }
  return d;
}

using fvt::to_ref;

}  // namespace

TEST_CASE("VSA metadata out of range never reads or writes out of bounds, on every backend") {
  const uint64_t seed = fvt::test_seed();
  std::mt19937_64 rng(seed ^ 0x1D3Au);
  const Inputs in(rng);
  for (auto& b : fvt::available_backends()) {
    for (const Case& c : cases()) {
      const std::string what = b->name() + ": " + c.name;
      INFO(what);
      Results wild, clean;
      if (!run_all(*b, in, c.wild, 0xFF, &wild)) break;  // the backend lacks a kernel: skip it
      REQUIRE(run_all(*b, in, c.clean, 0x00, &clean));
      require_identical(wild, clean, what);
      MESSAGE(what << ": identical to the clean metadata");
    }
  }
}

TEST_CASE("VSA duplicate q2k entries: counted twice in forward and backward, once in the inverse") {
  const uint64_t seed = fvt::test_seed();
  std::mt19937_64 rng(seed ^ 0xD0B1u);
  const Inputs in(rng);
  const Meta dup = duplicates_meta();
  const Meta once = deduplicated(dup);
  // The reference reads the lists the same way (every listed entry is a term).
  ref64::VsaIndex ridx;
  ridx.B = B, ridx.H = Hq, ridx.num_q_blocks = NQ, ridx.max_k = MAXK;
  ridx.q2k_idx = dup.idx, ridx.q2k_num = dup.num, ridx.block_sizes = dup.sizes;
  const ref64::Tensor rq = to_ref(in.q), rk = to_ref(in.k), rv = to_ref(in.v);
  const ref64::VsaForward rf = ref64::vsa_forward(ref64::VsaConfig{}, ref64::DType::BF16, rq, rk, rv, ridx);
  for (auto& b : fvt::available_backends()) {
    INFO(b->name());
    Results r, r_once;
    if (!run_all(*b, in, dup, 0xFF, &r)) continue;
    REQUIRE(run_all(*b, in, once, 0x00, &r_once));
    CHECK_MESSAGE(r.k2q_idx == r_once.k2q_idx, "k2q_idx lists a q block twice");
    CHECK_MESSAGE(r.k2q_num == r_once.k2q_num, "k2q_num counts a q block twice");
    // Forward and backward against reference64 (SPEC section 4 bounds), the backward from the
    // backend's own o and lse as in the CPU reference tests.
    CHECK_MESSAGE(fvt::count_nan(r.o_values) == 0, "o has NaN");
    CHECK(fvt::rel_l2(r.o_values, rf.o.data) <= 1e-2);
    CHECK(fvt::rel_l2(r.lse_values, rf.lse) <= 1e-3);
    HostTensor o(kDtype, {B, Hq, Sq, D});
    std::memcpy(o.data(), r.o.data(), r.o.size());
    const ref64::Grads rg = ref64::vsa_backward(ref64::VsaConfig{}, ref64::DType::BF16, rq, rk, rv, to_ref(o),
                                                r.lse_values, to_ref(in.dout), ridx);
    CHECK(fvt::rel_l2(r.dq_values, rg.dq.data) <= 1e-2);
    CHECK(fvt::rel_l2(r.dk_values, rg.dk.data) <= 1e-2);
    CHECK(fvt::rel_l2(r.dv_values, rg.dv.data) <= 1e-2);
    // And they really count twice: the duplicated lists do not give the deduplicated results.
    CHECK_MESSAGE(r.o != r_once.o, "duplicates made no difference to o");
    MESSAGE(b->name() << ": duplicates within SPEC bounds of reference64, inverse deduplicated");
  }
}
