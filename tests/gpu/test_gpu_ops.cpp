// The CUDA backend against the CPU reference backend (the oracle) and against tests/golden, through
// the public API. Fresh random shapes and values every run (the seed is printed; FVATTN_TEST_SEED
// replays one), lengths that are not tile multiples, causal, cross, GQA, BSHD strides with padded
// rows, bf16 and fp16, every scale mode. Outputs and workspaces start poisoned (0xFF: NaN), so an
// element a kernel forgets reads NaN and fails; row padding must stay untouched.
//
// Also: determinism of the backward, capture of every op in a CUDA graph and replay, several threads
// sharing one handle, and what the CUDA backend refuses.
//
// Without a usable GPU the program prints why and exits 77 (CTest: skipped).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shared/kernel_params.h"
#include "gpu/gpu_fixtures.h"
#include "support/golden.h"

using namespace fvt;

namespace {

constexpr double kTol = 1e-2;     // SPEC section 4: o, o_hp, dq, dk, dv
constexpr double kLseTol = 1e-3;  // SPEC section 4: lse

// FVATTN_GPU_TEST_QUICK=1 (set by tools/gpu-check under compute-sanitizer, which is ~100x slower):
// one random case per config instead of two, fewer VSA cases, no long shapes.
bool quick() {
  const char* q = std::getenv("FVATTN_GPU_TEST_QUICK");
  return q != nullptr && *q != '\0' && std::string(q) != "0";
}

std::mt19937_64& rng() {
  static std::mt19937_64 r(test_seed());
  return r;
}

int64_t uniform(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng());
}

std::vector<double> normal_values(int64_t n, double stddev = 1.0) {
  std::normal_distribution<double> d(0.0, stddev);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng());
  return v;
}

// A device workspace of exactly the queried size, poisoned.
DeviceBuffer device_workspace(size_t bytes) { return DeviceBuffer(bytes, 0xFF); }

void check_close(const std::string& what, const HostTensor& got, const HostTensor& ref, double tol) {
  const std::vector<double> g = got.values(), r = ref.values();
  const double e = rel_l2_floored(g, r);
  MESSAGE(what << ": rel L2 " << e);
  INFO(what << ": rel L2 " << e << ", NaN " << count_nan(g));
  CHECK_MESSAGE(!has_nan(g), what << " has " << count_nan(g) << " NaN");
  CHECK_MESSAGE(e <= tol, what << ": rel L2 " << e << " > " << tol);
  CHECK_MESSAGE(got.padding_intact(), what << ": the kernel wrote into row padding");
}

// ---- QAT ------------------------------------------------------------------------------------------

struct QatCase {
  std::string name;
  int64_t B, Hq, Hkv, Sq, Skv, D;
  int32_t dtype;
  Layout layout;
  int64_t pad;
  fva_qat_config_t cfg;
  // > 1: each 64-key tile's keys scaled by its own gain, log-uniform in [1, key_gain], so that rows'
  // maxima jump between tiles by far more than 2^8 (the sm_90a forward's lazy output scale).
  double key_gain = 1.0;
};

std::string describe(const QatCase& c) {
  return c.name + " B" + std::to_string(c.B) + " Hq" + std::to_string(c.Hq) + " Hkv" +
         std::to_string(c.Hkv) + " Sq" + std::to_string(c.Sq) + " Skv" + std::to_string(c.Skv) +
         " D" + std::to_string(c.D) + " " + dtype_name(c.dtype) +
         (c.layout == Layout::BSHD ? " BSHD" : " BHSD") + (c.pad ? " padded" : "") +
         (c.key_gain > 1.0 ? " key gains up to " + std::to_string(c.key_gain) : "");
}

struct QatTensors {
  HostTensor q, k, v, dout;
};

QatTensors make_qat_inputs(const QatCase& c) {
  QatTensors t{HostTensor(c.dtype, {c.B, c.Hq, c.Sq, c.D}, c.layout, c.pad),
               HostTensor(c.dtype, {c.B, c.Hkv, c.Skv, c.D}, c.layout, c.pad),
               HostTensor(c.dtype, {c.B, c.Hkv, c.Skv, c.D}, c.layout, c.pad),
               HostTensor(c.dtype, {c.B, c.Hq, c.Sq, c.D}, c.layout, c.pad)};
  t.q.fill(normal_values(t.q.numel()));
  // smooth_k matters when k has a per-channel offset; give it one.
  std::vector<double> kv = normal_values(t.k.numel());
  for (size_t i = 0; i < kv.size(); ++i) kv[i] += 0.5 * std::sin(static_cast<double>(i % c.D));
  if (c.key_gain > 1.0) {
    std::vector<double> gain(static_cast<size_t>((c.Skv + 63) / 64));
    std::uniform_real_distribution<double> log_gain(0.0, std::log(c.key_gain));
    for (double& g : gain) g = std::exp(log_gain(rng()));
    for (size_t i = 0; i < kv.size(); ++i) kv[i] *= gain[(i / c.D) % c.Skv / 64];  // logical [B,H,S,D]
  }
  t.k.fill(kv);
  t.v.fill(normal_values(t.v.numel()));
  t.dout.fill(normal_values(t.dout.numel()));
  return t;
}

struct QatForwardOut {
  HostTensor o, o_hp, lse;
};

QatForwardOut qat_outputs(const QatCase& c) {
  return {HostTensor(c.dtype, {c.B, c.Hq, c.Sq, c.D}, c.layout, c.pad),
          HostTensor(c.dtype, {c.B, c.Hq, c.Sq, c.D}, c.layout, c.pad),
          HostTensor(FVA_DTYPE_F32, {c.B, c.Hq, c.Sq})};
}

void cpu_qat_forward(const QatCase& c, const QatTensors& in, QatForwardOut& out) {
  CpuHandle h;
  size_t bytes = 0;
  REQUIRE_OK(fva_qat_forward_workspace_size(h.h, &c.cfg, in.q.t(), in.k.t(), in.v.t(), &bytes));
  AlignedBuffer ws = workspace(bytes);
  REQUIRE_OK(fva_qat_forward(h.h, &c.cfg, in.q.t(), in.k.t(), in.v.t(), out.o.t(),
                             c.cfg.high_precision_o ? out.o_hp.t() : nullptr, out.lse.t(), ws.data(),
                             bytes, nullptr));
}

void gpu_qat_forward(fva_handle_t h, const QatCase& c, const QatTensors& in, QatForwardOut& out,
                     cudaStream_t stream = nullptr) {
  DeviceTensor q(in.q), k(in.k), v(in.v), o(out.o), o_hp(out.o_hp), lse(out.lse);
  size_t bytes = 0;
  REQUIRE_OK(fva_qat_forward_workspace_size(h, &c.cfg, q.t(), k.t(), v.t(), &bytes));
  DeviceBuffer ws = device_workspace(bytes);
  REQUIRE_OK(fva_qat_forward(h, &c.cfg, q.t(), k.t(), v.t(), o.t(),
                             c.cfg.high_precision_o ? o_hp.t() : nullptr, lse.t(), ws.data(), bytes,
                             stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  o.download(out.o);
  o_hp.download(out.o_hp);
  lse.download(out.lse);
}

struct QatGrads {
  HostTensor dq, dk, dv;
};

QatGrads qat_grads(const QatCase& c) {
  return {HostTensor(c.dtype, {c.B, c.Hq, c.Sq, c.D}, c.layout, c.pad),
          HostTensor(c.dtype, {c.B, c.Hkv, c.Skv, c.D}, c.layout, c.pad),
          HostTensor(c.dtype, {c.B, c.Hkv, c.Skv, c.D}, c.layout, c.pad)};
}

void cpu_qat_backward(const QatCase& c, const QatTensors& in, const HostTensor& o_bwd,
                      const HostTensor& lse, QatGrads& g) {
  CpuHandle h;
  size_t bytes = 0;
  REQUIRE_OK(fva_qat_backward_workspace_size(h.h, &c.cfg, in.q.t(), in.k.t(), in.v.t(), &bytes));
  AlignedBuffer ws = workspace(bytes);
  REQUIRE_OK(fva_qat_backward(h.h, &c.cfg, in.q.t(), in.k.t(), in.v.t(), o_bwd.t(), lse.t(),
                              in.dout.t(), g.dq.t(), g.dk.t(), g.dv.t(), ws.data(), bytes, nullptr));
}

void gpu_qat_backward(fva_handle_t h, const QatCase& c, const QatTensors& in,
                      const HostTensor& o_bwd, const HostTensor& lse_in, QatGrads& g) {
  DeviceTensor q(in.q), k(in.k), v(in.v), ob(o_bwd), lse(lse_in), dout(in.dout);
  DeviceTensor dq(g.dq), dk(g.dk), dv(g.dv);
  size_t bytes = 0;
  REQUIRE_OK(fva_qat_backward_workspace_size(h, &c.cfg, q.t(), k.t(), v.t(), &bytes));
  DeviceBuffer ws = device_workspace(bytes);
  REQUIRE_OK(fva_qat_backward(h, &c.cfg, q.t(), k.t(), v.t(), ob.t(), lse.t(), dout.t(), dq.t(),
                              dk.t(), dv.t(), ws.data(), bytes, nullptr));
  dq.download(g.dq);
  dk.download(g.dk);
  dv.download(g.dv);
}

fva_qat_config_t config_named(const std::string& name) {
  fva_qat_config_t c = FVA_QAT_CONFIG_INIT;  // production preset
  if (name == "plain") c.quantize = 0;
  if (name == "plain-causal") c.quantize = 0, c.causal = 1;
  if (name == "causal") c.causal = 1;
  if (name == "tile") c.qkv_scale = FVA_SCALE_TILE, c.p_scale = FVA_SCALE_TILE;
  if (name == "row-p") c.p_scale = FVA_SCALE_ROW;
  if (name == "fastvideo-kernel-defaults")  // golden default_*: tile QKV, row P, smooth_k, no o_hp
    c.qkv_scale = FVA_SCALE_TILE, c.p_scale = FVA_SCALE_ROW, c.smooth_k = 1, c.high_precision_o = 0;
  if (name == "smooth-k") c.smooth_k = 1;
  if (name == "no-quant-p-bwd") c.quantize_p_backward = 0;
  if (name == "no-hp-o") c.high_precision_o = 0;
  if (name == "unquantized-qkv-bwd") c.quantized_qkv_backward = 0;
  if (name == "scale") c.softmax_scale = 0.05f;
  return c;
}

QatCase random_qat_case(const std::string& cfg_name) {
  QatCase c;
  c.name = cfg_name;
  c.cfg = config_named(cfg_name);
  c.B = uniform(1, 2);
  c.Hkv = uniform(1, 2);
  c.Hq = c.Hkv * uniform(1, 2);
  c.D = uniform(0, 1) ? 128 : 64;
  c.Sq = uniform(1, 300);
  c.Skv = uniform(0, 2) == 0 ? c.Sq : uniform(1, 300);
  c.dtype = uniform(0, 2) == 0 ? FVA_DTYPE_F16 : FVA_DTYPE_BF16;
  c.layout = uniform(0, 1) ? Layout::BSHD : Layout::BHSD;
  c.pad = uniform(0, 2) == 0 ? 8 : 0;
  return c;
}

// A forward's outputs within the tolerances of the reference's (o_hp where the config has it).
void check_qat_forward_close(const QatCase& c, const QatForwardOut& got,
                             const QatForwardOut& ref) {
  check_close("o", got.o, ref.o, kTol);
  if (c.cfg.high_precision_o) check_close("o_hp", got.o_hp, ref.o_hp, kTol);
  check_close("lse", got.lse, ref.lse, kLseTol);
}

// Two forwards' outputs bit for bit the same; `what` names the pair in a failure.
void check_qat_forward_bitwise(const QatForwardOut& a, const QatForwardOut& b, const char* what) {
  CHECK_MESSAGE(a.o.bits16() == b.o.bits16(), "o: " << what);
  CHECK_MESSAGE(a.o_hp.bits16() == b.o_hp.bits16(), "o_hp: " << what);
  CHECK_MESSAGE(a.lse.values() == b.lse.values(), "lse: " << what);
}

void check_qat_case(const QatCase& c) {
  INFO(describe(c));
  MESSAGE(describe(c));
  CudaHandle gpu;
  const QatTensors in = make_qat_inputs(c);
  QatForwardOut ref = qat_outputs(c), got = qat_outputs(c);
  cpu_qat_forward(c, in, ref);
  gpu_qat_forward(gpu.h, c, in, got);
  check_qat_forward_close(c, got, ref);

  // The backward from the reference's own forward outputs, so it is compared on its own.
  const HostTensor& o_bwd = c.cfg.high_precision_o ? ref.o_hp : ref.o;
  QatGrads gr = qat_grads(c), gg = qat_grads(c);
  cpu_qat_backward(c, in, o_bwd, ref.lse, gr);
  gpu_qat_backward(gpu.h, c, in, o_bwd, ref.lse, gg);
  check_close("dq", gg.dq, gr.dq, kTol);
  check_close("dk", gg.dk, gr.dk, kTol);
  check_close("dv", gg.dv, gr.dv, kTol);
}

// ---- VSA ------------------------------------------------------------------------------------------

struct VsaCase {
  int64_t B, Hq, Hkv, nqb, nkv, max_k, D;
  int32_t dtype;
  Layout layout;
  // > 1: each kv block's keys scaled by its own gain, log-uniform in [1, key_gain], so that the
  // scores of a list's blocks differ by far more than the forward's lazy-rescale threshold (2^8).
  double key_gain = 1.0;
  // > 0: o's rows padded by this many elements (a multiple of 8: the API takes strides of whole
  // 16 bytes), which the library must leave untouched.
  int64_t o_pad = 0;
  // Set: writes the lists, their counts and the block sizes itself (idx [B, Hq, nqb, max_k], num
  // [B, Hq, nqb], sizes [nkv], flat), in place of the random metadata.
  std::function<void(std::vector<int32_t>& idx, std::vector<int32_t>& num,
                     std::vector<int32_t>& sizes)>
      metadata = nullptr;
};

struct VsaInputs {
  HostTensor q, k, v, dout, idx, num, sizes;
};

void random_lists(const VsaCase& c, std::vector<int32_t>& idx, std::vector<int32_t>& num);

// Metadata with every irregularity the kernels must survive: ragged and empty blocks, block sizes
// outside [0, 64], and random_lists' lists.
VsaInputs make_vsa_inputs(const VsaCase& c) {
  const int64_t Sq = 64 * c.nqb, Skv = 64 * c.nkv;
  VsaInputs t{HostTensor(c.dtype, {c.B, c.Hq, Sq, c.D}, c.layout),
              HostTensor(c.dtype, {c.B, c.Hkv, Skv, c.D}, c.layout),
              HostTensor(c.dtype, {c.B, c.Hkv, Skv, c.D}, c.layout),
              HostTensor(c.dtype, {c.B, c.Hq, Sq, c.D}, c.layout),
              HostTensor(FVA_DTYPE_I32, {c.B, c.Hq, c.nqb, c.max_k}),
              HostTensor(FVA_DTYPE_I32, {c.B, c.Hq, c.nqb}),
              HostTensor(FVA_DTYPE_I32, {c.nkv})};
  t.q.fill(normal_values(t.q.numel()));
  std::vector<double> k = normal_values(t.k.numel());
  if (c.key_gain > 1.0) {
    std::vector<double> gain(static_cast<size_t>(c.nkv));
    std::uniform_real_distribution<double> log_gain(0.0, std::log(c.key_gain));
    for (double& g : gain) g = std::exp(log_gain(rng()));
    for (size_t i = 0; i < k.size(); ++i) k[i] *= gain[(i / c.D) % Skv / 64];  // logical [B,H,S,D]
  }
  t.k.fill(k);
  t.v.fill(normal_values(t.v.numel()));
  t.dout.fill(normal_values(t.dout.numel()));
  std::vector<int32_t> sizes(static_cast<size_t>(c.nkv));
  for (auto& s : sizes) {
    const int64_t r = uniform(0, 9);
    s = static_cast<int32_t>(r < 5 ? 64 : r == 5 ? 0 : r == 6 ? 70 : r == 7 ? -3 : uniform(1, 63));
  }
  std::vector<int32_t> idx, num;
  random_lists(c, idx, num);
  if (c.metadata) c.metadata(idx, num, sizes);
  t.sizes.fill_i32(sizes);
  t.idx.fill_i32(idx);
  t.num.fill_i32(num);
  return t;
}

// Lists with every irregularity the kernels must survive (idx [B, Hq, nqb, max_k], num [B, Hq,
// nqb], flat): counts outside [0, max_k], entries outside [0, nkv), duplicates.
void random_lists(const VsaCase& c, std::vector<int32_t>& idx, std::vector<int32_t>& num) {
  const int64_t rows = c.B * c.Hq * c.nqb;
  idx.assign(static_cast<size_t>(rows * c.max_k), 0);
  num.assign(static_cast<size_t>(rows), 0);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t r = uniform(0, 9);
    num[row] = static_cast<int32_t>(r == 0 ? 0 : r == 1 ? -2 : r == 2 ? c.max_k + 3 : uniform(1, c.max_k));
    // Mostly distinct ascending blocks (FastVideo's lists), sometimes junk.
    std::vector<int32_t> pick(static_cast<size_t>(c.nkv));
    for (int64_t i = 0; i < c.nkv; ++i) pick[i] = static_cast<int32_t>(i);
    std::shuffle(pick.begin(), pick.end(), rng());
    std::vector<int32_t> list(pick.begin(), pick.begin() + std::min<int64_t>(c.max_k, c.nkv));
    while (static_cast<int64_t>(list.size()) < c.max_k) list.push_back(static_cast<int32_t>(uniform(0, c.nkv - 1)));
    std::sort(list.begin(), list.end());
    for (int64_t s = 0; s < c.max_k; ++s) {
      int32_t e = list[s];
      const int64_t junk = uniform(0, 19);
      if (junk == 0) e = -1;
      if (junk == 1) e = static_cast<int32_t>(c.nkv + uniform(0, 3));
      if (junk == 2 && s > 0) e = idx[row * c.max_k + s - 1];  // a duplicate
      idx[row * c.max_k + s] = e;
    }
  }
}

std::string describe(const VsaCase& c) {
  return "VSA B" + std::to_string(c.B) + " Hq" + std::to_string(c.Hq) + " Hkv" +
         std::to_string(c.Hkv) + " nqb" + std::to_string(c.nqb) + " nkv" + std::to_string(c.nkv) +
         " max_k" + std::to_string(c.max_k) + " D" + std::to_string(c.D) + " " + dtype_name(c.dtype) +
         (c.layout == Layout::BSHD ? " BSHD" : " BHSD") +
         (c.key_gain > 1.0 ? " key gains up to " + std::to_string(c.key_gain) : "");
}

// fva_vsa_invert_indices on the GPU against the CPU backend, exactly.
void check_inverse(const VsaCase& c, const HostTensor& q2k_idx, const HostTensor& q2k_num) {
  CudaHandle gpu;
  HostTensor k2q_r(FVA_DTYPE_I32, {c.B, c.Hq, c.nkv, c.nqb}), k2q_g(FVA_DTYPE_I32, {c.B, c.Hq, c.nkv, c.nqb});
  HostTensor kn_r(FVA_DTYPE_I32, {c.B, c.Hq, c.nkv}), kn_g(FVA_DTYPE_I32, {c.B, c.Hq, c.nkv});
  {
    CpuHandle h;
    size_t bytes = 0;
    REQUIRE_OK(fva_vsa_invert_indices_workspace_size(h.h, q2k_idx.t(), k2q_r.t(), &bytes));
    AlignedBuffer ws = workspace(bytes);
    REQUIRE_OK(fva_vsa_invert_indices(h.h, q2k_idx.t(), q2k_num.t(), k2q_r.t(), kn_r.t(), ws.data(), bytes, nullptr));
  }
  {
    DeviceTensor idx(q2k_idx), num(q2k_num), k2q(k2q_g), kn(kn_g);
    size_t bytes = 0;
    REQUIRE_OK(fva_vsa_invert_indices_workspace_size(gpu.h, idx.t(), k2q.t(), &bytes));
    DeviceBuffer ws = device_workspace(bytes);
    REQUIRE_OK(fva_vsa_invert_indices(gpu.h, idx.t(), num.t(), k2q.t(), kn.t(), ws.data(), bytes, nullptr));
    k2q.download(k2q_g);
    kn.download(kn_g);
  }
  CHECK_MESSAGE(k2q_g.values_i32() == k2q_r.values_i32(), "k2q_idx differs from the CPU backend");
  CHECK_MESSAGE(kn_g.values_i32() == kn_r.values_i32(), "k2q_num differs from the CPU backend");
}

void check_vsa_case(const VsaCase& c) {
  INFO(describe(c));
  MESSAGE(describe(c));
  const VsaInputs in = make_vsa_inputs(c);
  const int64_t Sq = 64 * c.nqb, Skv = 64 * c.nkv;
  const fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;
  HostTensor o_ref(c.dtype, {c.B, c.Hq, Sq, c.D}, c.layout),
      o_got(c.dtype, {c.B, c.Hq, Sq, c.D}, c.layout, c.o_pad);
  HostTensor l_ref(FVA_DTYPE_F32, {c.B, c.Hq, Sq}), l_got(FVA_DTYPE_F32, {c.B, c.Hq, Sq});
  {
    CpuHandle h;
    size_t bytes = 0;
    REQUIRE_OK(fva_vsa_forward_workspace_size(h.h, &cfg, in.q.t(), in.k.t(), in.v.t(), in.idx.t(), &bytes));
    AlignedBuffer ws = workspace(bytes);
    REQUIRE_OK(fva_vsa_forward(h.h, &cfg, in.q.t(), in.k.t(), in.v.t(), in.idx.t(), in.num.t(),
                               in.sizes.t(), o_ref.t(), l_ref.t(), ws.data(), bytes, nullptr));
  }
  CudaHandle gpu;
  {
    DeviceTensor q(in.q), k(in.k), v(in.v), idx(in.idx), num(in.num), sizes(in.sizes), o(o_got), l(l_got);
    size_t bytes = 0;
    REQUIRE_OK(fva_vsa_forward_workspace_size(gpu.h, &cfg, q.t(), k.t(), v.t(), idx.t(), &bytes));
    DeviceBuffer ws = device_workspace(bytes);
    REQUIRE_OK(fva_vsa_forward(gpu.h, &cfg, q.t(), k.t(), v.t(), idx.t(), num.t(), sizes.t(), o.t(),
                               l.t(), ws.data(), bytes, nullptr));
    o.download(o_got);
    l.download(l_got);
  }
  check_close("vsa o", o_got, o_ref, kTol);
  CHECK_MESSAGE(o_got.padding_intact(), "the VSA forward wrote into o's row padding");
  // lse holds -inf for rows that saw no key: compare those exactly, the rest by rel L2.
  {
    std::vector<double> g = l_got.values(), r = l_ref.values(), gf, rf;
    int64_t inf_mismatch = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      if (std::isinf(r[i]) || std::isinf(g[i])) {
        inf_mismatch += g[i] != r[i];
      } else {
        gf.push_back(g[i]);
        rf.push_back(r[i]);
      }
    }
    CHECK_MESSAGE(inf_mismatch == 0, inf_mismatch << " lse rows differ in being -inf");
    CHECK_MESSAGE(rel_l2(gf, rf) <= kLseTol, "vsa lse rel L2 " << rel_l2(gf, rf));
  }

  // Backward from the reference's forward outputs.
  HostTensor dq_r(c.dtype, {c.B, c.Hq, Sq, c.D}, c.layout), dq_g(c.dtype, {c.B, c.Hq, Sq, c.D}, c.layout);
  HostTensor dk_r(c.dtype, {c.B, c.Hkv, Skv, c.D}, c.layout), dk_g(c.dtype, {c.B, c.Hkv, Skv, c.D}, c.layout);
  HostTensor dv_r(c.dtype, {c.B, c.Hkv, Skv, c.D}, c.layout), dv_g(c.dtype, {c.B, c.Hkv, Skv, c.D}, c.layout);
  {
    CpuHandle h;
    size_t bytes = 0;
    REQUIRE_OK(fva_vsa_backward_workspace_size(h.h, &cfg, in.q.t(), in.k.t(), in.v.t(), in.idx.t(), &bytes));
    AlignedBuffer ws = workspace(bytes);
    REQUIRE_OK(fva_vsa_backward(h.h, &cfg, in.q.t(), in.k.t(), in.v.t(), o_ref.t(), l_ref.t(),
                                in.dout.t(), in.idx.t(), in.num.t(), in.sizes.t(), dq_r.t(),
                                dk_r.t(), dv_r.t(), ws.data(), bytes, nullptr));
  }
  std::vector<uint16_t> first_dq, first_dk;
  for (int run = 0; run < 2; ++run) {  // twice: VSA's backward is reproducible on every handle
    DeviceTensor q(in.q), k(in.k), v(in.v), o(o_ref), l(l_ref), dout(in.dout), idx(in.idx),
        num(in.num), sizes(in.sizes), dq(dq_g), dk(dk_g), dv(dv_g);
    size_t bytes = 0;
    REQUIRE_OK(fva_vsa_backward_workspace_size(gpu.h, &cfg, q.t(), k.t(), v.t(), idx.t(), &bytes));
    DeviceBuffer ws = device_workspace(bytes);
    REQUIRE_OK(fva_vsa_backward(gpu.h, &cfg, q.t(), k.t(), v.t(), o.t(), l.t(), dout.t(), idx.t(),
                                num.t(), sizes.t(), dq.t(), dk.t(), dv.t(), ws.data(), bytes, nullptr));
    dq.download(dq_g);
    dk.download(dk_g);
    dv.download(dv_g);
    if (run == 0) {
      first_dq = dq_g.bits16();
      first_dk = dk_g.bits16();
    } else {
      CHECK_MESSAGE(first_dq == dq_g.bits16(), "VSA dQ differs between two identical runs");
      CHECK_MESSAGE(first_dk == dk_g.bits16(), "VSA dK differs between two identical runs");
    }
  }
  check_close("vsa dq", dq_g, dq_r, kTol);
  check_close("vsa dk", dk_g, dk_r, kTol);
  check_close("vsa dv", dv_g, dv_r, kTol);
  // Exact zeros for keys no query sees (kv blocks nobody selects, padding slots): there the
  // reference's dV is exactly 0, and so must dK and dV be. (dK alone can be exactly 0 on the CPU
  // and ~1e-8 on the GPU for a seen key: a row with one visible key has dS = dP - Delta, which
  // cancels exactly only when Delta is summed in the CPU's order.)
  // A seen key can still have a reference dV of exactly 0 when its P underflows the dtype (f16: a
  // dV below 2^-25 rounds to 0 while its dK need not): such a key has a
  // nonzero reference dK (seen on the H200: one f16 key, FVATTN_TEST_SEED=4088847496843479065),
  // so "unseen" means both reference gradients are exactly 0.
  const std::vector<double> gk = dk_g.values(), gv = dv_g.values(), rv = dv_r.values(),
                            rk = dk_r.values();
  int64_t nonzero = 0;
  for (size_t i = 0; i < rv.size(); ++i)
    nonzero += rv[i] == 0.0 && rk[i] == 0.0 && (gk[i] != 0.0 || gv[i] != 0.0);
  CHECK_MESSAGE(nonzero == 0, nonzero << " dK/dV elements are nonzero where the reference is exactly 0");

  check_inverse(c, in.idx, in.num);
}

VsaCase random_vsa_case() {
  VsaCase c;
  c.B = uniform(1, 2);
  c.Hkv = uniform(1, 2);
  c.Hq = c.Hkv * uniform(1, 2);
  c.nqb = uniform(1, 6);
  c.nkv = uniform(1, 7);
  c.max_k = uniform(1, c.nkv + 1);
  c.D = uniform(0, 1) ? 128 : 64;
  c.dtype = uniform(0, 2) == 0 ? FVA_DTYPE_F16 : FVA_DTYPE_BF16;
  c.layout = uniform(0, 1) ? Layout::BSHD : Layout::BHSD;
  return c;
}

}  // namespace

TEST_CASE("GPU QAT attention matches the CPU backend (random shapes, every config)") {
  const char* configs[] = {"production", "plain", "plain-causal", "causal", "tile", "row-p",
                           "fastvideo-kernel-defaults", "smooth-k", "no-quant-p-bwd", "no-hp-o",
                           "unquantized-qkv-bwd", "scale"};
  for (const char* name : configs)
    for (int rep = 0; rep < (quick() ? 1 : 2); ++rep) {
      SUBCASE((std::string(name) + " #" + std::to_string(rep)).c_str()) { check_qat_case(random_qat_case(name)); }
    }
}

TEST_CASE("GPU QAT attention at tile-multiple and long shapes") {
  if (quick()) return;
  for (const char* name : {"production", "causal", "plain"}) {
    QatCase c = random_qat_case(name);
    c.B = 1, c.Hq = 2, c.Hkv = 1, c.Sq = 1024, c.Skv = 1024, c.D = 128, c.dtype = FVA_DTYPE_BF16;
    c.layout = Layout::BHSD, c.pad = 0;
    check_qat_case(c);
  }
}

// Scores that jump between key tiles by far more than 2^8: the sm_90a forward keeps its
// accumulators relative to a reference max that moves only then, while FQ_P stays relative to the
// running max (quantized and plain, causal too).
TEST_CASE("GPU QAT attention matches the CPU backend when key tiles' scores differ by orders of magnitude") {
  for (const char* name : {"production", "plain", "causal"})
    for (int rep = 0; rep < (quick() ? 1 : 2); ++rep) {
      SUBCASE((std::string(name) + " #" + std::to_string(rep)).c_str()) {
        QatCase c = random_qat_case(name);
        c.Sq = uniform(65, 400);
        c.Skv = std::string(name) == "causal" ? c.Sq : uniform(130, 600);
        c.key_gain = 24.0;
        check_qat_case(c);
      }
    }
}

TEST_CASE("GPU VSA matches the CPU backend (ragged blocks, junk metadata, GQA)") {
  for (int rep = 0; rep < (quick() ? 4 : 12); ++rep) {
    SUBCASE(("random #" + std::to_string(rep)).c_str()) { check_vsa_case(random_vsa_case()); }
  }
}

// o's rows padded (by 16 and 48 bytes; the API requires strides of whole 16 bytes): the sm_90a
// forward's TMA stores o's tiles and must leave the padding alone.
TEST_CASE("GPU VSA forward with o's rows padded: the TMA stores leave the padding alone") {
  for (const int64_t pad : {8, 24}) {
    SUBCASE(("o rows padded by " + std::to_string(pad)).c_str()) {
      VsaCase c = random_vsa_case();
      c.o_pad = pad;
      check_vsa_case(c);
    }
  }
}

// Longer lists (tens of kv blocks, several q blocks per head), with every irregularity of
// make_vsa_inputs: the random cases above list at most eight blocks.
TEST_CASE("GPU VSA matches the CPU backend at longer lists") {
  for (int rep = 0; rep < (quick() ? 1 : 3); ++rep) {
    SUBCASE(("random #" + std::to_string(rep)).c_str()) {
      VsaCase c = random_vsa_case();
      c.nqb = uniform(5, 11);
      c.nkv = uniform(24, 48);
      c.max_k = uniform(8, c.nkv);
      check_vsa_case(c);
    }
  }
}

// The k2q inverse (kernels/indices/vsa_invert.cu) inverts short lists in one block per unit
// (fva_vsa_invert_unit), and otherwise cuts a unit's lists into chunks of consecutive q blocks
// (kern::invert_chunking), counted and placed chunk by chunk. More kv blocks than one block's
// window (kern::kInvertKvWindow) take the chunked kernels, in two windows: lists long enough for
// two or three chunks, the last one partial, of a length that is no multiple of 32 (the tally's
// and place's per-thread strides then straddle rows), with every irregularity of make_vsa_inputs
// (duplicates among them), through the whole backward.
TEST_CASE("GPU VSA matches the CPU backend when the k2q inverse cuts the lists into several chunks") {
  for (int rep = 0; rep < (quick() ? 1 : 2); ++rep) {
    SUBCASE(("random #" + std::to_string(rep)).c_str()) {
      VsaCase c = random_vsa_case();
      c.Hkv = 1;
      c.Hq = uniform(1, 2);
      c.nkv = fva::kern::kInvertKvWindow + uniform(1, 60);
      c.max_k = uniform(50, 55);
      const int64_t rows = fva::kern::invert_chunking(1 << 20, c.nkv, c.max_k).rows_per_chunk;
      c.nqb = rows + uniform(1, rows + 5);  // two chunks, or three with a short last one
      c.D = 64;
      const fva::kern::InvertChunking chunking = fva::kern::invert_chunking(c.nqb, c.nkv, c.max_k);
      REQUIRE(chunking.num_chunks >= 2);
      REQUIRE_FALSE(fva::kern::invert_in_one_block(c.Hq / c.Hkv, c.nqb, c.nkv, c.max_k));
      check_vsa_case(c);
    }
  }
}

// fva_vsa_invert_indices on both sides of the one-block inverse's limits
// (kern::invert_in_one_block): the most entries and kv blocks one block holds (its largest shared
// memory), one entry more, one kv block more, and a unit of two place batches.
TEST_CASE("GPU k2q inverse equals the CPU backend's on both sides of the one-block limits") {
  struct Shape {
    int64_t nqb, nkv, max_k;
    bool one_block;
  };
  const int64_t most = fva::kern::kInvertUnitMaxEntries, window = fva::kern::kInvertKvWindow;
  for (const Shape& s : {Shape{most / window, window, window, true},
                         Shape{most / window, window, window + 1, false},
                         Shape{4, window + 1, 100, false}, Shape{most / 55, 100, 55, true},
                         Shape{most / 55 + 1, 100, 55, false}}) {
    VsaCase c = random_vsa_case();
    c.Hq = c.Hkv = uniform(1, 3);
    c.nqb = s.nqb;
    c.nkv = s.nkv;
    c.max_k = s.max_k;
    INFO(describe(c));
    REQUIRE(fva::kern::invert_in_one_block(1, c.nqb, c.nkv, c.max_k) == s.one_block);
    std::vector<int32_t> idx, num;
    random_lists(c, idx, num);
    HostTensor q2k_idx(FVA_DTYPE_I32, {c.B, c.Hq, c.nqb, c.max_k}), q2k_num(FVA_DTYPE_I32, {c.B, c.Hq, c.nqb});
    q2k_idx.fill_i32(idx);
    q2k_num.fill_i32(num);
    check_inverse(c, q2k_idx, q2k_num);
  }
}

// The VSA backward runs Delta first, in a grid of four blocks per SM that strides over the rows
// beside the k2q inverse, and the inverse's last kernel waits for Delta's count of finished
// blocks (src/cuda/vsa_ops.cpp). Enough rows for two to three passes of that grid on the H200's
// 132 SMs (16896 rows per pass at D = 128, 33792 at D = 64), the last one partial; short lists keep
// the CPU reference quick. A Delta read before it is written reads the workspace's poison (NaN).
TEST_CASE("GPU VSA backward: Delta over several passes of its grid, beside the k2q inverse") {
  for (const int64_t D : {int64_t{128}, int64_t{64}}) {
    SUBCASE(("D=" + std::to_string(D)).c_str()) {
      VsaCase c = random_vsa_case();
      c.B = 1;
      c.Hkv = 2;
      c.Hq = D == 128 ? 4 : 8;
      c.nqb = uniform(150, 190);
      c.nkv = uniform(12, 24);
      c.max_k = uniform(1, 3);
      c.D = D;
      check_vsa_case(c);
    }
  }
}

// The sm_90a kernels walk a q2k list 32 entries at a time (VsaKeyTiles::Window): windows with no
// usable entry at all (junk indices, empty blocks, indices past the kv blocks), a usable entry
// right after such a window, lists longer than two windows with duplicates, a count past max_k,
// and lists with nothing usable anywhere. Written out, not drawn: the random cases reach a second
// window only sometimes.
TEST_CASE("GPU VSA matches the CPU backend when a list's 32-entry windows hold nothing usable") {
  VsaCase c;
  c.B = 1;
  c.Hq = 2;
  c.Hkv = 1;
  c.nqb = 5;
  c.nkv = 40;
  c.max_k = 100;
  c.D = 128;
  c.dtype = FVA_DTYPE_BF16;
  c.layout = Layout::BHSD;
  c.metadata = [&c](std::vector<int32_t>& idx, std::vector<int32_t>& num,
                    std::vector<int32_t>& sizes) {
    for (int64_t kv = 0; kv < c.nkv; ++kv)  // 0-9 empty, 20-29 ragged, the rest full
      sizes[kv] = kv < 10 ? 0 : (kv >= 20 && kv < 30) ? 17 + static_cast<int32_t>(kv) : 64;
    for (int64_t h = 0; h < c.Hq; ++h) {
      auto list = [&](int64_t qb) { return &idx[(h * c.nqb + qb) * c.max_k]; };
      auto count = [&](int64_t qb) -> int32_t& { return num[h * c.nqb + qb]; };
      int32_t* l = list(0);  // junk window, usable window, empty-block window, 4 usable
      for (int i = 0; i < 100; ++i)
        l[i] = i < 32 ? -1 : i < 64 ? 10 + (i - 32) % 30 : i < 96 ? (i - 64) % 10 : 36 + (i - 96);
      count(0) = 100;
      l = list(1);  // one usable entry, first of the second window
      for (int i = 0; i < 100; ++i) l[i] = i == 32 ? 25 : static_cast<int32_t>(i % 10);
      count(1) = 33;
      l = list(2);  // all usable, duplicates, the count past max_k (clamped to 100)
      for (int i = 0; i < 100; ++i) l[i] = 10 + (i * 7) % 30;
      count(2) = 150;
      l = list(3);  // two windows of nothing usable: no key, o = 0 and lse = -inf
      for (int i = 0; i < 100; ++i) l[i] = i < 32 ? static_cast<int32_t>(c.nkv + i) : i % 10;
      count(3) = 64;
      l = list(4);  // exactly one window, its last entry the only usable one
      for (int i = 0; i < 100; ++i) l[i] = i == 31 ? 39 : -5;
      count(4) = 32;
    }
  };
  check_vsa_case(c);
}

// The VSA backward orders its dK/dV blocks by list length for up to 4096 kv blocks
// (kern::kVsaOrderMaxKvBlocks: the order kernel's shared-memory array) and runs them in index order
// beyond: both sides of the limit, with short lists (most kv blocks then have none).
TEST_CASE("GPU VSA matches the CPU backend at the dK/dV block order's limit") {
  for (const bool past : {false, true}) {
    SUBCASE(past ? "past the limit: index order" : "at the limit: ordered") {
      VsaCase c = random_vsa_case();
      c.B = 1;
      c.Hkv = 1;
      c.nqb = uniform(1, 3);
      c.nkv = past ? 4097 + uniform(0, 8) : 4096;
      c.max_k = uniform(1, 6);
      c.D = 64;
      check_vsa_case(c);
    }
  }
}

// The backward's dK/dV blocks run rank by rank across the (b, kv head) units while the call's Q and
// dO fit in the device's L2, unit by unit past it (schedules/dkdv_grid.cuh, plan_vsa_backward); the
// other VSA cases are small, so this one puts Q and dO just past the L2, with a GQA group of two.
TEST_CASE("GPU VSA matches the CPU backend when Q and dO outgrow the L2 (dK/dV unit by unit)") {
  int l2_bytes = 0;
  CUDA_OK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0));
  VsaCase c = random_vsa_case();
  c.B = 1;
  c.Hkv = 1;
  c.Hq = 2;
  c.D = 64;
  const int64_t query_side_bytes_per_q_block = 2 * c.Hq * 64 * c.D * 2;  // Q and dO, 2-byte types
  c.nqb = l2_bytes / query_side_bytes_per_q_block + uniform(1, 8);
  c.nkv = uniform(4, 12);
  c.max_k = uniform(1, 2);
  REQUIRE(c.nqb * query_side_bytes_per_q_block > l2_bytes);
  check_vsa_case(c);
}

// Scores that jump between a list's blocks by far more than 2^8 (the forward's lazy rescale): rows
// whose later blocks score higher move their reference max, rows whose later blocks score lower
// keep it.
TEST_CASE("GPU VSA matches the CPU backend when kv blocks' scores differ by orders of magnitude") {
  for (int rep = 0; rep < (quick() ? 1 : 3); ++rep) {
    SUBCASE(("random #" + std::to_string(rep)).c_str()) {
      VsaCase c = random_vsa_case();
      c.nqb = uniform(2, 6);
      c.nkv = uniform(8, 24);
      c.max_k = uniform(4, c.nkv);
      c.key_gain = 24.0;
      check_vsa_case(c);
    }
  }
}

namespace {

// A VSA backward's gradients (as the case's tensors) and the workspace it asked for.
struct VsaGrads {
  HostTensor dq, dk, dv;
  size_t workspace = 0;
};
VsaGrads empty_vsa_grads(const VsaCase& c) {
  const int64_t Sq = 64 * c.nqb, Skv = 64 * c.nkv;
  return VsaGrads{HostTensor(c.dtype, {c.B, c.Hq, Sq, c.D}, c.layout),
                  HostTensor(c.dtype, {c.B, c.Hkv, Skv, c.D}, c.layout),
                  HostTensor(c.dtype, {c.B, c.Hkv, Skv, c.D}, c.layout)};
}
// The forward's o and lse on the CPU backend (what the backwards below take).
void cpu_vsa_forward(const VsaCase& c, const VsaInputs& in, HostTensor& o, HostTensor& l) {
  o = HostTensor(c.dtype, {c.B, c.Hq, 64 * c.nqb, c.D}, c.layout);
  l = HostTensor(FVA_DTYPE_F32, {c.B, c.Hq, 64 * c.nqb});
  CpuHandle h;
  const fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;
  size_t bytes = 0;
  REQUIRE_OK(fva_vsa_forward_workspace_size(h.h, &cfg, in.q.t(), in.k.t(), in.v.t(), in.idx.t(), &bytes));
  AlignedBuffer ws = workspace(bytes);
  REQUIRE_OK(fva_vsa_forward(h.h, &cfg, in.q.t(), in.k.t(), in.v.t(), in.idx.t(), in.num.t(), in.sizes.t(),
                             o.t(), l.t(), ws.data(), bytes, nullptr));
}
// The forward's o and lse on handle h (same shapes as cpu_vsa_forward's).
void gpu_vsa_forward(fva_handle_t h, const VsaCase& c, const VsaInputs& in, HostTensor& o_out,
                     HostTensor& l_out) {
  o_out = HostTensor(c.dtype, {c.B, c.Hq, 64 * c.nqb, c.D}, c.layout);
  l_out = HostTensor(FVA_DTYPE_F32, {c.B, c.Hq, 64 * c.nqb});
  const fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;
  DeviceTensor q(in.q), k(in.k), v(in.v), idx(in.idx), num(in.num), sizes(in.sizes), o(o_out),
      l(l_out);
  size_t bytes = 0;
  REQUIRE_OK(fva_vsa_forward_workspace_size(h, &cfg, q.t(), k.t(), v.t(), idx.t(), &bytes));
  DeviceBuffer ws = device_workspace(bytes);
  REQUIRE_OK(fva_vsa_forward(h, &cfg, q.t(), k.t(), v.t(), idx.t(), num.t(), sizes.t(), o.t(),
                             l.t(), ws.data(), bytes, nullptr));
  o.download(o_out);
  l.download(l_out);
}
VsaGrads cpu_vsa_backward(const VsaCase& c, const VsaInputs& in, const HostTensor& o_ref,
                          const HostTensor& l_ref) {
  const fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;
  VsaGrads r = empty_vsa_grads(c);
  CpuHandle h;
  REQUIRE_OK(fva_vsa_backward_workspace_size(h.h, &cfg, in.q.t(), in.k.t(), in.v.t(), in.idx.t(), &r.workspace));
  AlignedBuffer ws = workspace(r.workspace);
  REQUIRE_OK(fva_vsa_backward(h.h, &cfg, in.q.t(), in.k.t(), in.v.t(), o_ref.t(), l_ref.t(), in.dout.t(),
                              in.idx.t(), in.num.t(), in.sizes.t(), r.dq.t(), r.dk.t(), r.dv.t(), ws.data(),
                              r.workspace, nullptr));
  return r;
}
VsaGrads gpu_vsa_backward(const VsaCase& c, const VsaInputs& in, const HostTensor& o_ref,
                          const HostTensor& l_ref,
                          const fva_handle_options_t& options = test_handle_options()) {
  const fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;
  VsaGrads r = empty_vsa_grads(c);
  HostTensor &dq_g = r.dq, &dk_g = r.dk, &dv_g = r.dv;
  CudaHandle gpu(options);
  DeviceTensor q(in.q), k(in.k), v(in.v), o(o_ref), l(l_ref), dout(in.dout), idx(in.idx), num(in.num),
      sizes(in.sizes), dq(dq_g), dk(dk_g), dv(dv_g);
  REQUIRE_OK(fva_vsa_backward_workspace_size(gpu.h, &cfg, q.t(), k.t(), v.t(), idx.t(), &r.workspace));
  DeviceBuffer ws = device_workspace(r.workspace);
  REQUIRE_OK(fva_vsa_backward(gpu.h, &cfg, q.t(), k.t(), v.t(), o.t(), l.t(), dout.t(), idx.t(), num.t(),
                              sizes.t(), dq.t(), dk.t(), dv.t(), ws.data(), r.workspace, nullptr));
  dq.download(dq_g);
  dk.download(dk_g);
  dv.download(dv_g);
  return r;
}

// A test handle's options with a stored-dS budget of `mib` MiB.
fva_handle_options_t with_ds_budget(int32_t mib, fva_handle_options_t o = test_handle_options()) {
  o.ds_budget_mib = mib;
  return o;
}

}  // namespace

TEST_CASE("GPU VSA backward: stored dS in chunks, bit for bit the one-chunk result; above the budget, recomputed") {
  // On sm_90a (native kernels) the backward stores every listed pair's dS tile (8 KiB) in the
  // workspace, in chunks of (b, kv head) units that fit the handle's ds_budget_mib. Here each unit's
  // tiles take exactly 1 MiB (2 q heads x 8 q blocks x 8 slots x 8 KiB), so a budget of 1 MiB runs
  // the four units one by one, 2 MiB two by two, and the default all at once.
  VsaCase c{2, 4, 2, 8, 8, 8, uniform(0, 1) ? 128 : 64, FVA_DTYPE_BF16, Layout::BHSD};
  const VsaInputs in = make_vsa_inputs(c);
  HostTensor o_ref, l_ref;
  cpu_vsa_forward(c, in, o_ref, l_ref);
  // The default budget, whatever the suite's (CTest also runs the suite with a budget of 0).
  const VsaGrads whole = gpu_vsa_backward(c, in, o_ref, l_ref, with_ds_budget(2048));
  const VsaGrads ref = cpu_vsa_backward(c, in, o_ref, l_ref);
  check_close("vsa dq", whole.dq, ref.dq, kTol);
  check_close("vsa dk", whole.dk, ref.dk, kTol);
  check_close("vsa dv", whole.dv, ref.dv, kTol);
  CudaHandle probe;
  const bool stores_ds = runs_native_sm90(probe.h);
  INFO("D " << c.D << ", native sm_90a kernels " << stores_ds);
  for (const int32_t budget : {1, 2}) {
    const VsaGrads chunked = gpu_vsa_backward(c, in, o_ref, l_ref, with_ds_budget(budget));
    CHECK_MESSAGE(chunked.dq.bits16() == whole.dq.bits16(), "dQ differs with a budget of " << budget << " MiB");
    CHECK_MESSAGE(chunked.dk.bits16() == whole.dk.bits16(), "dK differs with a budget of " << budget << " MiB");
    CHECK_MESSAGE(chunked.dv.bits16() == whole.dv.bits16(), "dV differs with a budget of " << budget << " MiB");
    // The tiles' share of the workspace: 4, 2 or 1 MiB (the rest does not depend on the budget).
    const size_t saved = (4 - static_cast<size_t>(budget)) << 20;
    CHECK(whole.workspace - chunked.workspace == (stores_ds ? saved : 0));
  }
  // A unit whose tiles do not fit the budget: the dQ kernel that recomputes S and dP runs instead,
  // with no tiles in the workspace (here 1.125 MiB a unit: 9 q blocks, against 1 MiB).
  {
    VsaCase c9 = c;
    c9.nqb = 9;
    const VsaInputs in9 = make_vsa_inputs(c9);
    HostTensor o9, l9;
    cpu_vsa_forward(c9, in9, o9, l9);
    const VsaGrads stored = gpu_vsa_backward(c9, in9, o9, l9, with_ds_budget(2048));
    const VsaGrads recomputed = gpu_vsa_backward(c9, in9, o9, l9, with_ds_budget(1));
    const VsaGrads ref9 = cpu_vsa_backward(c9, in9, o9, l9);
    CHECK(stored.workspace - recomputed.workspace == (stores_ds ? size_t{9} << 19 : 0));  // 4 x 1.125 MiB
    for (const VsaGrads* g : {&stored, &recomputed}) {
      check_close("vsa dq", g->dq, ref9.dq, kTol);
      check_close("vsa dk", g->dk, ref9.dk, kTol);
      check_close("vsa dv", g->dv, ref9.dv, kTol);
    }
    // dK and dV come from the same products either way (dQ from differently computed dS).
    CHECK(stored.dk.bits16() == recomputed.dk.bits16());
    CHECK(stored.dv.bits16() == recomputed.dv.bits16());
  }
}

// A test handle's options with the QAT forward's split and clusters set.
static fva_handle_options_t with_forward(int32_t split, int32_t clusters = FVA_OPTION_AUTO) {
  fva_handle_options_t o = test_handle_options();
  o.qat_forward_split = split;
  o.qat_forward_clusters = clusters;
  return o;
}

// The sm_90a QAT forward splits its grid's tail over the key tiles (sm90/forward_split.cuh): the
// handle option qat_forward_split forces N pieces on the tiles of the last wave (here every tile:
// a test's few tiles fill less than one wave). Each split result against the reference, and o no
// further from it than the unsplit kernel's but for rounding (a piece whose FQ_P started its
// running max from its own keys would be 10x further); every run twice, bit for bit; lse against
// the unsplit kernel's; the pieces' states (and, quantized P, their keys' maxima) in the
// workspace. Key tiles with gains far apart make the pieces' maxima differ by more than the lazy
// rescale's 2^8, so merges scale by 0 too, and a later piece's running max starts far above its
// own keys'.
TEST_CASE("GPU QAT forward with its tail split over the key tiles") {
  CudaHandle probe;
  const bool native = runs_native_sm90(probe.h);
  const char* configs[] = {"production", "plain", "no-hp-o"};
  for (int rep = 0; rep < (quick() ? 3 : 6); ++rep) {
    const std::string name = configs[rep % 3];
    SUBCASE((name + " #" + std::to_string(rep)).c_str()) {
      QatCase c = random_qat_case(name);
      c.Sq = uniform(65, 400);
      c.Skv = uniform(200, 700);  // 4 to 11 key tiles: 8 pieces are clamped to their count
      c.key_gain = rep >= 3 ? 24.0 : 1.0;
      INFO(describe(c));
      MESSAGE(describe(c));
      const QatTensors in = make_qat_inputs(c);
      QatForwardOut ref = qat_outputs(c);
      cpu_qat_forward(c, in, ref);
      auto workspace_bytes = [&](const CudaHandle& gpu) {
        DeviceTensor q(in.q), k(in.k), v(in.v);
        size_t bytes = 0;
        REQUIRE_OK(fva_qat_forward_workspace_size(gpu.h, &c.cfg, q.t(), k.t(), v.t(), &bytes));
        return bytes;
      };
      CudaHandle unsplit(with_forward(0));
      QatForwardOut whole = qat_outputs(c);
      gpu_qat_forward(unsplit.h, c, in, whole);
      const size_t whole_bytes = workspace_bytes(unsplit);
      const int64_t key_tiles = (c.Skv + 63) / 64;
      for (const int32_t pieces : {2, 3, 8}) {
        INFO("qat_forward_split=" << pieces);
        CudaHandle gpu(with_forward(pieces));
        QatForwardOut got = qat_outputs(c), again = qat_outputs(c);
        gpu_qat_forward(gpu.h, c, in, got);
        gpu_qat_forward(gpu.h, c, in, again);
        check_qat_forward_close(c, got, ref);
        check_qat_forward_bitwise(got, again, "differs between two identical runs");
        check_close("lse against unsplit", got.lse, whole.lse, 2e-4);
        const double e_split = rel_l2_floored(got.o.values(), ref.o.values()),
                     e_whole = rel_l2_floored(whole.o.values(), ref.o.values());
        CHECK_MESSAGE(e_split <= 2.0 * e_whole + 1e-3,
                      "o: rel L2 " << e_split << " split against " << e_whole << " unsplit");
        // The states: per split tile (every tile here) and piece but the last, two consumers'
        // 128 threads of sm90_forward_partial_floats floats and two flags each, and (quantized
        // P) 2 maxima per thread, in whole 64-byte lines (an empty workspace gains its 64-byte
        // pad).
        const int64_t n = std::min<int64_t>({pieces, key_tiles, 8});
        const int64_t tiles = c.B * c.Hq * ((c.Sq + 127) / 128);
        const int64_t slots = tiles * (n - 1) * 2;
        const bool q = c.cfg.quantize != 0;
        const int64_t per_thread = ((q ? c.D / 2 : 0) + c.D / 2 + 6 + 3) / 4 * 4;
        auto lines = [](int64_t bytes) { return static_cast<size_t>((bytes + 63) / 64 * 64); };
        const size_t expected = !native ? 0
                                        : lines(slots * 128 * per_thread * 4) + lines(slots * 2 * 4) +
                                              (q ? lines(slots * 128 * 2 * 4) : 0) + (whole_bytes == 0 ? 64 : 0);
        CHECK(workspace_bytes(gpu) - whole_bytes == expected);
      }
      // A call given the unsplit workspace is refused, not run short.
      if (native) {
        CudaHandle gpu(with_forward(2));
        DeviceTensor q(in.q), k(in.k), v(in.v);
        QatForwardOut out = qat_outputs(c);
        DeviceTensor o(out.o), o_hp(out.o_hp), lse(out.lse);
        DeviceBuffer ws = device_workspace(whole_bytes);
        CHECK(fva_qat_forward(gpu.h, &c.cfg, q.t(), k.t(), v.t(), o.t(),
                              c.cfg.high_precision_o ? o_hp.t() : nullptr, lse.t(), ws.data(),
                              whole_bytes, nullptr) == FVA_ERR_WORKSPACE_TOO_SMALL);
      }
    }
  }
}

// The sm_90a QAT forward runs in clusters of two blocks that share their K/V loads by TMA
// multicast where the shape allows (not causal, an even count of 128-row query tiles per head;
// sm90/attention_forward.cuh). Both blocks compute exactly what each would alone, so o,
// o_hp and lse are bit for bit those of the forward without clusters (qat_forward_clusters = 0),
// whole and with the tail split over 2 and 3 pieces (the pieces' block order differs in
// clusters), and within the tolerance of the reference. Ragged last tiles (rows past Sq in a
// cluster's block), GQA, both head sizes, and shapes without clusters (an odd count of tiles,
// causal) that fall back.
TEST_CASE("GPU QAT forward in clusters of two: bit for bit the forward without them") {
  const char* configs[] = {"production", "plain", "no-hp-o", "plain-causal"};
  for (int rep = 0; rep < (quick() ? 4 : 8); ++rep) {
    const std::string name = configs[rep % 4];
    SUBCASE((name + " #" + std::to_string(rep)).c_str()) {
      QatCase c = random_qat_case(name);
      // Even query tiles per head (a ragged last one), but every fifth case odd: no clusters.
      const int64_t q_tiles = rep % 5 == 4 ? 3 : 2 * uniform(1, 2);
      c.Sq = 128 * q_tiles - uniform(0, 100);
      c.Skv = uniform(130, 700);
      c.key_gain = rep % 2 ? 24.0 : 1.0;
      INFO(describe(c));
      MESSAGE(describe(c));
      const QatTensors in = make_qat_inputs(c);
      QatForwardOut ref = qat_outputs(c);
      cpu_qat_forward(c, in, ref);
      for (const int32_t pieces : {0, 2, 3}) {
        INFO("qat_forward_split=" << pieces);
        QatForwardOut alone = qat_outputs(c), paired = qat_outputs(c);
        {
          CudaHandle gpu(with_forward(pieces, 0));
          gpu_qat_forward(gpu.h, c, in, alone);
        }
        {
          CudaHandle gpu(with_forward(pieces, rep % 3 ? 1 : FVA_OPTION_AUTO));
          gpu_qat_forward(gpu.h, c, in, paired);
        }
        check_qat_forward_close(c, paired, ref);
        check_qat_forward_bitwise(paired, alone, "clusters against none");
      }
    }
  }
}

// Every CUDA op launches its kernels after the first as programmatic dependent launches
// (src/cuda/kernel_images.h, LaunchChain): a kernel's blocks may be resident while the kernel
// before it finishes, and every kernel waits for its predecessor before it touches memory
// (kernels/primitives/kernel_chain.cuh; Delta runs beside it and waits before it exits). A kernel
// that read too early would read its inputs unfinished, so chained, the outputs must be bit for bit
// those of the kernels the stream alone orders (chained_launches = 0), at shapes of several waves
// of blocks, repeated: the QAT forward (production, its tail split, whose flags are zeroed before
// the chain), the QAT backward on a deterministic handle, the VSA forward, and the VSA backward
// (the inverse's five kernels, the block order, Delta, then dK/dV and dQ in one chunk and in four).
TEST_CASE("GPU chained launches (PDL): bit for bit the kernels the stream alone orders") {
  auto chained = [](int32_t chained_launches, fva_handle_options_t o) {
    o.chained_launches = chained_launches;
    return o;
  };
  auto qat_run = [&](const QatCase& c, const QatTensors& in, int32_t pdl, QatForwardOut& f,
                     QatGrads& g) {
    fva_handle_options_t o = test_handle_options(/*deterministic=*/true);
    o.qat_forward_split = 2;  // a memset of the flags before the chain
    CudaHandle gpu(chained(pdl, o));
    gpu_qat_forward(gpu.h, c, in, f);
    gpu_qat_backward(gpu.h, c, in, c.cfg.high_precision_o ? f.o_hp : f.o, f.lse, g);
  };
  for (const char* name : {"production", "plain"}) {
    SUBCASE((std::string("QAT ") + name).c_str()) {
      QatCase c = random_qat_case(name);
      c.B = 1, c.Hkv = 2, c.Hq = 4, c.D = 128, c.dtype = FVA_DTYPE_BF16, c.layout = Layout::BHSD;
      c.Sq = uniform(900, 1500), c.Skv = uniform(900, 1500), c.pad = 0;
      INFO(describe(c));
      const QatTensors in = make_qat_inputs(c);
      QatForwardOut f0 = qat_outputs(c);
      QatGrads g0 = qat_grads(c);
      qat_run(c, in, 0, f0, g0);
      for (const int32_t pdl : {1, FVA_OPTION_AUTO}) {
        INFO("chained_launches=" << pdl);
        QatForwardOut f = qat_outputs(c);
        QatGrads g = qat_grads(c);
        qat_run(c, in, pdl, f, g);
        check_qat_forward_bitwise(f, f0, "chained launches against stream-ordered ones");
        CHECK_MESSAGE(g.dq.bits16() == g0.dq.bits16(), "dQ: chained against stream-ordered");
        CHECK_MESSAGE(g.dk.bits16() == g0.dk.bits16(), "dK: chained against stream-ordered");
        CHECK_MESSAGE(g.dv.bits16() == g0.dv.bits16(), "dV: chained against stream-ordered");
      }
    }
  }
  SUBCASE("VSA") {
    VsaCase c{1, 4, 2, 40, 40, 12, 128, FVA_DTYPE_BF16, Layout::BHSD};
    INFO(describe(c));
    const VsaInputs in = make_vsa_inputs(c);
    HostTensor o0, l0;
    {
      CudaHandle gpu(chained(0, test_handle_options()));
      gpu_vsa_forward(gpu.h, c, in, o0, l0);
    }
    // Each q head's tiles: 40 q blocks x 12 slots x 8 KiB = 3.75 MiB, so 8 MiB holds one (b, kv
    // head) unit of two q heads: two chunks (on sm_90a; the other kernels ignore the budget).
    for (const int32_t budget : {2048, 8}) {
      INFO("ds_budget_mib=" << budget);
      const VsaGrads g0 = gpu_vsa_backward(c, in, o0, l0, chained(0, with_ds_budget(budget)));
      for (int rep = 0; rep < 3; ++rep) {
        const fva_handle_options_t o =
            chained(rep == 2 ? FVA_OPTION_AUTO : 1, with_ds_budget(budget));
        CudaHandle gpu(o);
        HostTensor o_got, l_got;
        gpu_vsa_forward(gpu.h, c, in, o_got, l_got);
        CHECK_MESSAGE(o_got.bits16() == o0.bits16(), "VSA o: chained against stream-ordered");
        CHECK_MESSAGE(l_got.values() == l0.values(), "VSA lse: chained against stream-ordered");
        const VsaGrads g = gpu_vsa_backward(c, in, o0, l0, o);
        CHECK_MESSAGE(g.dq.bits16() == g0.dq.bits16(), "VSA dQ: chained against stream-ordered");
        CHECK_MESSAGE(g.dk.bits16() == g0.dk.bits16(), "VSA dK: chained against stream-ordered");
        CHECK_MESSAGE(g.dv.bits16() == g0.dv.bits16(), "VSA dV: chained against stream-ordered");
      }
    }
  }
}

// D drawn from 16-192, then 64 and 128, which block mode runs with kernels of their own (D a
// constant); S from 1 to 200, so a (b, h)'s last work unit is often partial.
TEST_CASE("GPU NVFP4 fake quantization is bit-exact with the CPU backend") {
  for (const int64_t fixed_d : {int64_t{0}, int64_t{64}, int64_t{128}}) {
    for (int mode : {FVA_SCALE_BLOCK, FVA_SCALE_TILE}) {
      const int64_t B = uniform(1, 2), H = uniform(1, 3), S = uniform(1, 200);
      const int64_t D = fixed_d > 0 ? fixed_d : 16 * uniform(1, 12);
      const int32_t dtype = uniform(0, 1) ? FVA_DTYPE_BF16 : FVA_DTYPE_F16;
      INFO("mode " << mode << " B" << B << " H" << H << " S" << S << " D" << D);
      HostTensor x(dtype, {B, H, S, D}, Layout::BSHD), y_ref(dtype, {B, H, S, D}), y_got(dtype, {B, H, S, D});
      std::vector<double> vals = normal_values(x.numel(), 3.0);
      for (size_t i = 0; i < vals.size(); i += 97) vals[i] = 0.0;  // some all-but-zero groups
      x.fill(vals);
      fva_nvfp4_config_t cfg = FVA_NVFP4_CONFIG_INIT;
      cfg.scale_mode = mode;
      cfg.tile_tokens = static_cast<int32_t>(uniform(1, 64));
      CpuHandle cpu;
      REQUIRE_OK(fva_nvfp4_fake_quantize(cpu.h, &cfg, x.t(), y_ref.t(), nullptr));
      CudaHandle gpu;
      DeviceTensor dx(x), dy(y_got);
      REQUIRE_OK(fva_nvfp4_fake_quantize(gpu.h, &cfg, dx.t(), dy.t(), nullptr));
      dy.download(y_got);
      CHECK(y_got.bits16() == y_ref.bits16());
      // In place (y = x): every group is read whole before it is written.
      HostTensor y_in_place(dtype, {B, H, S, D}, Layout::BSHD);
      REQUIRE_OK(fva_nvfp4_fake_quantize(gpu.h, &cfg, dx.t(), dx.t(), nullptr));
      dx.download(y_in_place);
      CHECK(y_in_place.bits16() == y_ref.bits16());
    }
  }
}

TEST_CASE("GPU results against FastVideo's golden outputs") {
  for (const GoldenCase& gc : list_golden("qat")) {
    INFO("golden " << gc.name);
    MESSAGE("golden " << gc.name);
    const ref64::QatConfig rc = golden_qat_config(gc);
    QatCase c;
    c.name = gc.name;
    c.cfg = FVA_QAT_CONFIG_INIT;
    c.cfg.causal = rc.causal;
    c.cfg.quantize = rc.quantize;
    c.cfg.smooth_k = rc.smooth_k;
    c.cfg.qkv_scale = static_cast<int32_t>(rc.qkv_scale);
    c.cfg.p_scale = static_cast<int32_t>(rc.p_scale);
    c.cfg.quantize_p_backward = rc.quantize_p_backward;
    c.cfg.high_precision_o = rc.high_precision_o;
    c.cfg.quantized_qkv_backward = rc.quantized_qkv_backward;
    c.cfg.softmax_scale = static_cast<float>(gc.sm_scale);
    const auto qs = golden_shape(gc, "q"), ks = golden_shape(gc, "k");
    c.B = qs[0], c.Hq = qs[1], c.Sq = qs[2], c.D = qs[3], c.Hkv = ks[1], c.Skv = ks[2];
    c.dtype = FVA_DTYPE_BF16, c.layout = Layout::BHSD, c.pad = 0;
    auto load = [&](const char* name, std::vector<int64_t> shape) {
      HostTensor t(FVA_DTYPE_BF16, shape);
      t.fill(golden_tensor(gc, name).data);
      return t;
    };
    QatTensors in{load("q", qs), load("k", ks), load("v", ks), load("do", qs)};
    QatForwardOut got = qat_outputs(c), ref = qat_outputs(c);
    CudaHandle gpu;
    gpu_qat_forward(gpu.h, c, in, got);
    cpu_qat_forward(c, in, ref);
    // Every case at SPEC section 4's bounds, tile and row scales included: the kernels divide there
    // as FastVideo's do (nvfp4/fastvideo_division.h).
    const double tol = kTol;
    HostTensor g_o = load("o", qs);
    check_close("o vs golden", got.o, g_o, tol);
    check_close("o vs CPU backend", got.o, ref.o, kTol);
    std::vector<double> g_lse = golden_f32(gc, "lse"), lse = got.lse.values();
    CHECK_MESSAGE(rel_l2(lse, g_lse) <= kLseTol, "lse vs golden " << rel_l2(lse, g_lse));
    check_close("lse vs CPU backend", got.lse, ref.lse, kLseTol);
    // Backward from golden's o_bwd and lse.
    HostTensor o_bwd = load("o_bwd", qs), lse_g(FVA_DTYPE_F32, {c.B, c.Hq, c.Sq});
    lse_g.fill(g_lse);
    QatGrads gg = qat_grads(c);
    gpu_qat_backward(gpu.h, c, in, o_bwd, lse_g, gg);
    check_close("dq vs golden", gg.dq, load("dq", qs), tol);
    check_close("dk vs golden", gg.dk, load("dk", ks), tol);
    check_close("dv vs golden", gg.dv, load("dv", ks), tol);
  }
  for (const GoldenCase& gc : list_golden("vsa")) {
    INFO("golden " << gc.name);
    const auto qs = golden_shape(gc, "q"), ks = golden_shape(gc, "k");
    auto load = [&](const char* name, std::vector<int64_t> shape) {
      HostTensor t(FVA_DTYPE_BF16, shape);
      t.fill(golden_tensor(gc, name).data);
      return t;
    };
    HostTensor q = load("q", qs), k = load("k", ks), v = load("v", ks), dout = load("do", qs);
    const std::vector<int32_t> idx_v = golden_i32(gc, "q2k_idx"), num_v = golden_i32(gc, "q2k_num");
    const auto is = golden_shape(gc, "q2k_idx");
    HostTensor idx(FVA_DTYPE_I32, is), num(FVA_DTYPE_I32, {is[0], is[1], is[2]}), sizes(FVA_DTYPE_I32, {ks[2] / 64});
    idx.fill_i32(idx_v);
    num.fill_i32(num_v);
    sizes.fill_i32(golden_i32(gc, "vbs"));
    HostTensor o(FVA_DTYPE_BF16, qs), lse(FVA_DTYPE_F32, {qs[0], qs[1], qs[2]});
    HostTensor dq(FVA_DTYPE_BF16, qs), dk(FVA_DTYPE_BF16, ks), dv(FVA_DTYPE_BF16, ks);
    CudaHandle gpu;
    const fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;
    DeviceTensor dq_(q), dk_(k), dv_(v), di(idx), dn(num), ds(sizes), d_o(o), dl(lse), ddo(dout),
        gq(dq), gk(dk), gv(dv);
    size_t bytes = 0, fwd_bytes = 0;
    REQUIRE_OK(fva_vsa_forward_workspace_size(gpu.h, &cfg, dq_.t(), dk_.t(), dv_.t(), di.t(), &fwd_bytes));
    REQUIRE_OK(fva_vsa_backward_workspace_size(gpu.h, &cfg, dq_.t(), dk_.t(), dv_.t(), di.t(), &bytes));
    bytes = std::max(bytes, fwd_bytes);
    DeviceBuffer ws = device_workspace(bytes);
    REQUIRE_OK(fva_vsa_forward(gpu.h, &cfg, dq_.t(), dk_.t(), dv_.t(), di.t(), dn.t(), ds.t(), d_o.t(),
                               dl.t(), ws.data(), bytes, nullptr));
    REQUIRE_OK(fva_vsa_backward(gpu.h, &cfg, dq_.t(), dk_.t(), dv_.t(), d_o.t(), dl.t(), ddo.t(), di.t(),
                                dn.t(), ds.t(), gq.t(), gk.t(), gv.t(), ws.data(), bytes, nullptr));
    d_o.download(o);
    dl.download(lse);
    gq.download(dq);
    gk.download(dk);
    gv.download(dv);
    check_close("vsa o vs golden", o, load("o", qs), kTol);
    CHECK(rel_l2(lse.values(), golden_f32(gc, "lse")) <= kLseTol);
    check_close("vsa dq vs golden", dq, load("dq", qs), kTol);
    check_close("vsa dk vs golden", dk, load("dk", ks), kTol);
    check_close("vsa dv vs golden", dv, load("dv", ks), kTol);
  }
}

TEST_CASE("GPU QAT backward workspace: stored dS tiles, or the fused dQ's accumulator") {
  // On sm_90 with the native kernels the QAT backward stores every (query tile, key tile) pair's
  // dS tile, 8 KiB, in the workspace while they fit the handle's ds_budget_mib, on every handle.
  // Beyond it (here: a budget of 0), at D = 128 a handle that is not deterministic reduces dQ into
  // an fp32 accumulator instead: 4 (D + 1) bytes per head and query row, rows rounded up to 64.
  // Other devices and kernel sets need neither.
  QatCase c = random_qat_case("production");
  c.D = 128;
  const QatTensors in = make_qat_inputs(c);
  DeviceTensor q(in.q), k(in.k), v(in.v);
  auto bytes_of = [&](bool deterministic, int32_t budget) {
    CudaHandle h(with_ds_budget(budget, test_handle_options(deterministic)));
    size_t bytes = 0;
    REQUIRE_OK(fva_qat_backward_workspace_size(h.h, &c.cfg, q.t(), k.t(), v.t(), &bytes));
    return bytes;
  };
  CudaHandle probe;
  const bool native = runs_native_sm90(probe.h);
  const size_t tiles = static_cast<size_t>(c.B * c.Hq * ((c.Sq + 63) / 64) * ((c.Skv + 63) / 64)) * 8192;
  const size_t accumulator =
      static_cast<size_t>(c.B * c.Hq * ((c.Sq + 63) / 64) * 64 * (c.D + 1) * 4);
  INFO(describe(c) << ", native sm_90a kernels " << native);
  const size_t det_stored = bytes_of(true, 2048), fast_stored = bytes_of(false, 2048);
  const size_t det_plain = bytes_of(true, 0), fast_plain = bytes_of(false, 0);
  CHECK(det_stored == fast_stored);
  CHECK(det_stored == det_plain + (native ? tiles : 0));
  CHECK(fast_plain == det_plain + (native ? accumulator : 0));
}

TEST_CASE("GPU backward is bitwise deterministic, and every op replays from a CUDA graph") {
  QatCase c = random_qat_case("production");
  c.Sq = 200, c.Skv = 260;
  const QatTensors in = make_qat_inputs(c);
  CudaHandle gpu(true);
  QatForwardOut direct = qat_outputs(c);
  gpu_qat_forward(gpu.h, c, in, direct);

  // Forward and backward captured in one graph on a non-default stream, replayed twice.
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  QatForwardOut graphed = qat_outputs(c);
  QatGrads g1 = qat_grads(c), g2 = qat_grads(c);
  DeviceTensor q(in.q), k(in.k), v(in.v), dout(in.dout), o(graphed.o), o_hp(graphed.o_hp),
      lse(graphed.lse), dq(g1.dq), dk(g1.dk), dv(g1.dv);
  size_t fb = 0, bb = 0;
  REQUIRE_OK(fva_qat_forward_workspace_size(gpu.h, &c.cfg, q.t(), k.t(), v.t(), &fb));
  REQUIRE_OK(fva_qat_backward_workspace_size(gpu.h, &c.cfg, q.t(), k.t(), v.t(), &bb));
  DeviceBuffer fws = device_workspace(fb), bws = device_workspace(bb);
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const fva_status_t s1 = fva_qat_forward(gpu.h, &c.cfg, q.t(), k.t(), v.t(), o.t(), o_hp.t(), lse.t(),
                                          fws.data(), fb, stream);
  const fva_status_t s2 = fva_qat_backward(gpu.h, &c.cfg, q.t(), k.t(), v.t(), o_hp.t(), lse.t(),
                                           dout.t(), dq.t(), dk.t(), dv.t(), bws.data(), bb, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  REQUIRE_MESSAGE(s1 == FVA_OK, fva_last_error());
  REQUIRE_MESSAGE(s2 == FVA_OK, fva_last_error());
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  o.download(graphed.o);
  lse.download(graphed.lse);
  dq.download(g1.dq);
  dk.download(g1.dk);
  dv.download(g1.dv);
  CHECK_MESSAGE(graphed.o.bits16() == direct.o.bits16(), "graph replay o differs from a direct call");
  CHECK(graphed.lse.values() == direct.lse.values());
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  dq.download(g2.dq);
  dk.download(g2.dk);
  dv.download(g2.dv);
  CHECK_MESSAGE(g1.dq.bits16() == g2.dq.bits16(), "dQ differs between two replays");
  CHECK_MESSAGE(g1.dk.bits16() == g2.dk.bits16(), "dK differs between two replays");
  CHECK_MESSAGE(g1.dv.bits16() == g2.dv.bits16(), "dV differs between two replays");

  // The VSA ops and the NVFP4 op in a graph too.
  VsaCase vc = random_vsa_case();
  const VsaInputs vin = make_vsa_inputs(vc);
  const int64_t Sq = 64 * vc.nqb, Skv = 64 * vc.nkv;
  HostTensor vo(vc.dtype, {vc.B, vc.Hq, Sq, vc.D}, vc.layout), vl(FVA_DTYPE_F32, {vc.B, vc.Hq, Sq});
  HostTensor vdq(vc.dtype, {vc.B, vc.Hq, Sq, vc.D}, vc.layout), vdk(vc.dtype, {vc.B, vc.Hkv, Skv, vc.D}, vc.layout),
      vdv(vc.dtype, {vc.B, vc.Hkv, Skv, vc.D}, vc.layout);
  HostTensor k2q(FVA_DTYPE_I32, {vc.B, vc.Hq, vc.nkv, vc.nqb}), kn(FVA_DTYPE_I32, {vc.B, vc.Hq, vc.nkv});
  HostTensor fq(vc.dtype, {vc.B, vc.Hq, Sq, vc.D}, vc.layout);
  DeviceTensor a(vin.q), b(vin.k), cc(vin.v), d(vin.dout), e(vin.idx), f(vin.num), g(vin.sizes), ho(vo), hl(vl),
      hq(vdq), hk(vdk), hv(vdv), hk2q(k2q), hkn(kn), hfq(fq);
  const fva_vsa_config_t vcfg = FVA_VSA_CONFIG_INIT;
  size_t vb = 0, vfb = 0, ib = 0;
  REQUIRE_OK(fva_vsa_forward_workspace_size(gpu.h, &vcfg, a.t(), b.t(), cc.t(), e.t(), &vfb));
  REQUIRE_OK(fva_vsa_backward_workspace_size(gpu.h, &vcfg, a.t(), b.t(), cc.t(), e.t(), &vb));
  REQUIRE_OK(fva_vsa_invert_indices_workspace_size(gpu.h, e.t(), hk2q.t(), &ib));
  vb = std::max(vb, vfb);  // the forward's and the backward's, one after the other
  DeviceBuffer vws = device_workspace(vb), iws = device_workspace(ib);
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const fva_status_t v1 = fva_vsa_forward(gpu.h, &vcfg, a.t(), b.t(), cc.t(), e.t(), f.t(), g.t(), ho.t(),
                                          hl.t(), vws.data(), vb, stream);
  const fva_status_t v2 = fva_vsa_backward(gpu.h, &vcfg, a.t(), b.t(), cc.t(), ho.t(), hl.t(), d.t(), e.t(),
                                           f.t(), g.t(), hq.t(), hk.t(), hv.t(), vws.data(), vb, stream);
  const fva_status_t v3 = fva_vsa_invert_indices(gpu.h, e.t(), f.t(), hk2q.t(), hkn.t(), iws.data(), ib, stream);
  const fva_status_t v4 = fva_nvfp4_fake_quantize(gpu.h, nullptr, a.t(), hfq.t(), stream);
  cudaGraph_t vgraph;
  CUDA_OK(cudaStreamEndCapture(stream, &vgraph));
  CHECK(v1 == FVA_OK);
  CHECK(v2 == FVA_OK);
  CHECK(v3 == FVA_OK);
  CHECK(v4 == FVA_OK);
  cudaGraphExec_t vexec;
  CUDA_OK(cudaGraphInstantiate(&vexec, vgraph, 0));
  CUDA_OK(cudaGraphLaunch(vexec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  hk.download(vdk);
  const std::vector<uint16_t> first = vdk.bits16();
  CUDA_OK(cudaGraphLaunch(vexec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  hk.download(vdk);
  CHECK_MESSAGE(first == vdk.bits16(), "VSA dK differs between two graph replays");
  hq.download(vdq);
  CHECK(!has_nan(vdq.values()));
  CUDA_OK(cudaGraphExecDestroy(vexec));
  CUDA_OK(cudaGraphDestroy(vgraph));
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST_CASE("GPU: eight threads sharing one handle get the serial results") {
  QatCase c = random_qat_case("production");
  c.Sq = 192, c.Skv = 192;
  const QatTensors in = make_qat_inputs(c);
  CudaHandle gpu;
  QatForwardOut serial = qat_outputs(c);
  gpu_qat_forward(gpu.h, c, in, serial);
  constexpr int kThreads = 8;
  std::vector<QatForwardOut> outs;
  for (int i = 0; i < kThreads; ++i) outs.push_back(qat_outputs(c));
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      // doctest assertions are not thread-safe: the threads only record what went wrong (the
      // device-memory calls of support/cuda_memory.h throw; caught below). Plain allocations and
      // copies rather than DeviceTensors: their poisoning memset runs on the legacy default stream,
      // which is not ordered with this thread's non-blocking one.
      cudaStream_t s;
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        errors[i] = "cudaStreamCreate failed";
        return;
      }
      std::vector<void*> mem;  // everything this thread allocates, freed below whatever happens
      auto on_device = [&mem](const HostTensor& h, bool upload) {
        mem.push_back(cuda::alloc(h.bytes()));
        if (upload) cuda::copy_to_device(mem.back(), h.data(), h.bytes());
        fva_tensor_t t = h.desc();
        t.data = mem.back();
        return t;
      };
      try {
        const fva_tensor_t tq = on_device(in.q, true), tk = on_device(in.k, true), tv = on_device(in.v, true);
        const fva_tensor_t to = on_device(outs[i].o, false), toh = on_device(outs[i].o_hp, false),
                           tl = on_device(outs[i].lse, false);
        size_t bytes = 0;
        fva_status_t st = fva_qat_forward_workspace_size(gpu.h, &c.cfg, &tq, &tk, &tv, &bytes);
        mem.push_back(cuda::alloc(bytes ? bytes : 1));
        void* ws = mem.back();
        for (int rep = 0; rep < 4 && st == FVA_OK; ++rep)
          st = fva_qat_forward(gpu.h, &c.cfg, &tq, &tk, &tv, &to, &toh, &tl, ws, bytes, s);
        if (st != FVA_OK) errors[i] = fva_last_error();
        cudaStreamSynchronize(s);
        cuda::copy_to_host(outs[i].o.data(), to.data, outs[i].o.bytes());
        cuda::copy_to_host(outs[i].lse.data(), tl.data, outs[i].lse.bytes());
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
      for (void* p : mem) cuda::release(p);
      cudaStreamDestroy(s);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    INFO("thread " << i);
    CHECK(errors[i].empty());
    CHECK(outs[i].o.bits16() == serial.o.bits16());
    CHECK(outs[i].lse.values() == serial.lse.values());
  }
}

TEST_CASE("GPU: what the CUDA kernels do not cover is refused, naming the CPU backend") {
  CudaHandle gpu;
  QatCase c = random_qat_case("production");
  c.D = 32;
  HostTensor q(FVA_DTYPE_BF16, {1, 1, 64, 32});
  DeviceTensor dq(q);
  size_t bytes = 0;
  CHECK(fva_qat_forward_workspace_size(gpu.h, &c.cfg, dq.t(), dq.t(), dq.t(), &bytes) == FVA_ERR_UNSUPPORTED);
  CHECK(std::string(fva_last_error()).find("FVA_BACKEND_CPU") != std::string::npos);
}

