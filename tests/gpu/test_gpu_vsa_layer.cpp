// The whole VSA layer (SPEC section 3b) on the CUDA backend, through the public API:
//   - against the CPU backend (the oracle) on the same inputs, fresh random shapes and values every
//     run (the seed is printed; FVATTN_TEST_SEED replays one): ragged, empty and out-of-range block
//     sizes for q and kv, nq != nkv, GQA, D 64 and 128, bf16 and f16, topk 1, topk = nkv and topk >
//     nkv, gate and no gate, every kv block empty, BSHD views and padded output rows, lists long
//     enough for several tiles of every coarse kernel and rows full of tied scores. Outputs, reserve
//     and workspace start poisoned (0xFF: NaN, -1); no NaN may come out; row padding stays untouched.
//     The selected lists must equal the CPU's, except for a q block whose k-th and (k+1)-th scores
//     (float64 reference, tools/reference64) lie within one dtype step, in which case the rest is
//     compared with the float64 reference run on the GPU's own lists;
//   - against tests/golden/vsa_layer (FastVideo's own video_sparse_attn): out, dq, dk, dv, dgate
//     within SPEC 4's 1e-2, the lists equal golden's up to SPEC 3b's one exception;
//   - the backward twice gives the same bits; forward and backward replay from a CUDA graph;
//   - a reserve written for another shape, another topk, without the gate (or never written) makes
//     the backward leave every output untouched (its kernels check the reserve's record on the
//     device), and the right reserve afterwards still works.
//
// Without a usable GPU the program prints why and exits 77 (CTest: skipped).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_fixtures.h"
#include "reference64.h"
#include "support/golden.h"
#include "support/reference_bridge.h"

using namespace fvt;

namespace {

constexpr double kTol = 1e-2;  // SPEC section 4: out, dq, dk, dv, dgate
constexpr int64_t kBlock = 64;

// FVATTN_GPU_TEST_QUICK=1 (tools/gpu-check under compute-sanitizer): fewer and smaller cases.
bool quick() {
  const char* q = std::getenv("FVATTN_GPU_TEST_QUICK");
  return q != nullptr && *q != '\0' && std::string(q) != "0";
}

std::mt19937_64& rng() {
  static std::mt19937_64 r(test_seed() ^ 0x6c617965ull);
  return r;
}
int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng()); }

void check_close(const std::string& what, const std::vector<double>& got, const std::vector<double>& ref,
                 double tol = kTol) {
  REQUIRE(got.size() == ref.size());
  const double e = rel_l2_floored(got, ref);
  MESSAGE(what << ": rel L2 " << e);
  CHECK_MESSAGE(!has_nan(got), what << " has " << count_nan(got) << " NaN");
  CHECK_MESSAGE(e <= tol, what << ": rel L2 " << e << " > " << tol);
}

// ---- cases ------------------------------------------------------------------------------------------

enum class Sizes {
  kRagged,    // full, ragged, empty, and out of [0, 64] (clamped) blocks, for q and kv
  kFull,      // every block full
  kEmptyKv,   // every kv block empty (q ragged)
};

struct LayerCase {
  std::string name;
  int32_t dtype = FVA_DTYPE_BF16;
  int64_t B = 1, Hq = 1, Hkv = 1, nq = 1, nkv = 1, D = 64, topk = 1;
  bool gate = false;
  Layout layout = Layout::BHSD;
  int64_t pad = 0;       // row padding of the outputs (elements, a multiple of 8)
  double scale = 0.0;    // 0: 1/sqrt(D)
  Sizes sizes = Sizes::kRagged;
  int64_t tied_kv = 0;   // > 0: the first tied_kv kv blocks of every head are copies of block 0
};

std::string describe(const LayerCase& c) {
  return c.name + ": B" + std::to_string(c.B) + " Hq" + std::to_string(c.Hq) + " Hkv" + std::to_string(c.Hkv) +
         " nq" + std::to_string(c.nq) + " nkv" + std::to_string(c.nkv) + " D" + std::to_string(c.D) + " topk" +
         std::to_string(c.topk) + " " + dtype_name(c.dtype) + (c.gate ? " gate" : " no gate") +
         (c.layout == Layout::BSHD ? " BSHD" : " BHSD") + (c.pad ? " padded" : "") +
         (c.tied_kv ? " tied kv blocks " + std::to_string(c.tied_kv) : "");
}

struct LayerInputs {
  HostTensor q, k, v, gate, dout, q_sizes, kv_sizes;
  std::vector<int32_t> qsz, kvsz;  // as given (before clamping)
};

std::vector<int32_t> random_sizes(int64_t n, Sizes mode, bool is_kv) {
  std::vector<int32_t> s(static_cast<size_t>(n));
  for (int32_t& x : s) {
    const int64_t r = uniform(0, 11);
    if (mode == Sizes::kFull) x = 64;
    else if (mode == Sizes::kEmptyKv && is_kv) x = r < 6 ? 0 : -5;
    else x = static_cast<int32_t>(r < 4 ? 64 : r < 8 ? uniform(1, 63) : r < 10 ? 0 : r == 10 ? 70 : -3);
  }
  if (mode == Sizes::kRagged && is_kv &&
      std::none_of(s.begin(), s.end(), [](int32_t x) { return x > 0; }))
    s[static_cast<size_t>(uniform(0, n - 1))] = 37;
  return s;
}

LayerInputs make_inputs(const LayerCase& c) {
  const std::vector<int64_t> qs{c.B, c.Hq, c.nq * kBlock, c.D}, ks{c.B, c.Hkv, c.nkv * kBlock, c.D};
  LayerInputs in{HostTensor(c.dtype, qs, c.layout), HostTensor(c.dtype, ks, c.layout),
                 HostTensor(c.dtype, ks, c.layout), HostTensor(c.dtype, qs, c.layout),
                 HostTensor(c.dtype, qs, c.layout), HostTensor(FVA_DTYPE_I32, {c.nq}),
                 HostTensor(FVA_DTYPE_I32, {c.nkv}), {}, {}};
  // Padding slots hold values too: the means must not read them, the fine branch must mask them.
  in.q.fill_normal(rng());
  std::vector<double> k = in.k.fill_normal(rng());
  if (c.tied_kv > 0) {  // logical [B, Hkv, S, D]: blocks 1 .. tied_kv - 1 copy block 0
    const int64_t S = c.nkv * kBlock;
    for (int64_t bh = 0; bh < c.B * c.Hkv; ++bh)
      for (int64_t j = 1; j < std::min(c.tied_kv, c.nkv); ++j)
        for (int64_t t = 0; t < kBlock * c.D; ++t)
          k[static_cast<size_t>((bh * S + j * kBlock) * c.D + t)] = k[static_cast<size_t>((bh * S) * c.D + t)];
    in.k.fill(k);
  }
  in.v.fill_normal(rng());
  in.gate.fill_normal(rng(), 0.5, 0.5);
  in.dout.fill_normal(rng());
  in.qsz = random_sizes(c.nq, c.sizes, false);
  in.kvsz = random_sizes(c.nkv, c.sizes, true);
  if (c.tied_kv > 0)  // tied blocks tie only with equal sizes
    for (int64_t j = 0; j < std::min(c.tied_kv, c.nkv); ++j) in.kvsz[static_cast<size_t>(j)] = 64;
  in.q_sizes.fill_i32(in.qsz);
  in.kv_sizes.fill_i32(in.kvsz);
  return in;
}

int64_t effective_topk(const LayerCase& c) { return std::min(c.topk, c.nkv); }

fva_vsa_layer_config_t config_of(const LayerCase& c) {
  fva_vsa_layer_config_t cfg = FVA_VSA_LAYER_CONFIG_INIT;
  cfg.topk = static_cast<int32_t>(c.topk);
  cfg.softmax_scale = static_cast<float>(c.scale);
  return cfg;
}

// What one forward and backward leave: the outputs (as host tensors of the case's geometry).
struct LayerOutputs {
  HostTensor out, idx, num, dq, dk, dv, dgate;
};
LayerOutputs empty_outputs(const LayerCase& c) {
  const std::vector<int64_t> qs{c.B, c.Hq, c.nq * kBlock, c.D}, ks{c.B, c.Hkv, c.nkv * kBlock, c.D};
  const int64_t k = effective_topk(c);
  return {HostTensor(c.dtype, qs, c.layout, c.pad),    HostTensor(FVA_DTYPE_I32, {c.B, c.Hq, c.nq, k}),
          HostTensor(FVA_DTYPE_I32, {c.B, c.Hq, c.nq}), HostTensor(c.dtype, qs, c.layout, c.pad),
          HostTensor(c.dtype, ks, c.layout, c.pad),    HostTensor(c.dtype, ks, c.layout, c.pad),
          HostTensor(c.dtype, qs, c.layout, c.pad)};
}

LayerOutputs cpu_layer(const LayerCase& c, const LayerInputs& in) {
  CpuHandle h;
  const fva_vsa_layer_config_t cfg = config_of(c);
  LayerOutputs o = empty_outputs(c);
  size_t ws_bytes = 0, res_bytes = 0;
  REQUIRE_OK(fva_vsa_layer_sizes(h.h, &cfg, in.q.t(), in.k.t(), in.v.t(), &ws_bytes, &res_bytes));
  AlignedBuffer ws = workspace(ws_bytes), res = workspace(res_bytes);
  const fva_tensor_t* gate = c.gate ? in.gate.t() : nullptr;
  REQUIRE_OK(fva_vsa_layer_forward(h.h, &cfg, in.q.t(), in.k.t(), in.v.t(), gate, in.q_sizes.t(),
                                   in.kv_sizes.t(), o.out.t(), o.idx.t(), o.num.t(), res.data(), res_bytes,
                                   ws.data(), ws_bytes, nullptr));
  REQUIRE_OK(fva_vsa_layer_backward(h.h, &cfg, in.q.t(), in.k.t(), in.v.t(), gate, in.q_sizes.t(),
                                    in.kv_sizes.t(), in.dout.t(), res.data(), res_bytes, o.dq.t(), o.dk.t(),
                                    o.dv.t(), c.gate ? o.dgate.t() : nullptr, ws.data(), ws_bytes, nullptr));
  return o;
}

// fva_vsa_layer_sizes' answer.
struct LayerSizes {
  size_t ws = 0, reserve = 0;
};
LayerSizes layer_sizes(fva_handle_t h, const fva_vsa_layer_config_t& cfg, const DeviceTensor& q,
                       const DeviceTensor& k, const DeviceTensor& v) {
  LayerSizes s;
  REQUIRE_OK(fva_vsa_layer_sizes(h, &cfg, q.t(), k.t(), v.t(), &s.ws, &s.reserve));
  return s;
}

// The case's tensors on the device, its sizes, reserve and workspace (poisoned).
struct GpuLayer {
  const LayerCase& c;
  fva_handle_t h;
  fva_vsa_layer_config_t cfg;
  DeviceTensor q, k, v, gate, dout, q_sizes, kv_sizes;
  LayerSizes sizes;
  size_t ws_bytes, res_bytes;
  DeviceBuffer ws, res;

  GpuLayer(fva_handle_t handle, const LayerCase& lc, const LayerInputs& in)
      : c(lc), h(handle), cfg(config_of(lc)), q(in.q), k(in.k), v(in.v), gate(in.gate), dout(in.dout),
        q_sizes(in.q_sizes), kv_sizes(in.kv_sizes), sizes(layer_sizes(h, cfg, q, k, v)),
        ws_bytes(sizes.ws), res_bytes(sizes.reserve), ws(ws_bytes, 0xFF), res(res_bytes, 0xFF) {}
  const fva_tensor_t* gate_t() const { return c.gate ? gate.t() : nullptr; }
  fva_status_t forward(const DeviceTensor& out, const DeviceTensor* idx, const DeviceTensor* num,
                       cudaStream_t stream = nullptr) {
    return fva_vsa_layer_forward(h, &cfg, q.t(), k.t(), v.t(), gate_t(), q_sizes.t(), kv_sizes.t(), out.t(),
                                 idx ? idx->t() : nullptr, num ? num->t() : nullptr, res.data(), res_bytes,
                                 ws.data(), ws_bytes, stream);
  }
  fva_status_t backward(const DeviceTensor& dq, const DeviceTensor& dk, const DeviceTensor& dv,
                        const DeviceTensor& dgate, cudaStream_t stream = nullptr, const void* reserve = nullptr,
                        size_t reserve_bytes = 0) {
    return fva_vsa_layer_backward(h, &cfg, q.t(), k.t(), v.t(), gate_t(), q_sizes.t(), kv_sizes.t(), dout.t(),
                                  reserve ? reserve : res.data(), reserve ? reserve_bytes : res_bytes, dq.t(),
                                  dk.t(), dv.t(), c.gate ? dgate.t() : nullptr, ws.data(), ws_bytes, stream);
  }
};

LayerOutputs gpu_layer(fva_handle_t h, const LayerCase& c, const LayerInputs& in) {
  LayerOutputs o = empty_outputs(c);
  GpuLayer g(h, c, in);
  DeviceTensor out(o.out), idx(o.idx), num(o.num), dq(o.dq), dk(o.dk), dv(o.dv), dgate(o.dgate);
  REQUIRE_OK(g.forward(out, &idx, &num));
  REQUIRE_OK(g.backward(dq, dk, dv, dgate));
  out.download(o.out);
  idx.download(o.idx);
  num.download(o.num);
  dq.download(o.dq);
  dk.download(o.dk);
  dv.download(o.dv);
  dgate.download(o.dgate);
  return o;
}

// ---- the selection rule (SPEC 3b) -------------------------------------------------------------------

// The GPU's lists against `want` (the CPU's, or golden's), equal but for one-step ties of the
// float64 scores ([rows, nkv]; ref64::check_selection). Lists: [rows, k], ascending, -1 past the count.
ref64::SelectionCheck compare_lists(const std::vector<int32_t>& got_idx, const std::vector<int32_t>& got_num,
                                    const std::vector<int32_t>& want_idx, const std::vector<int32_t>& want_num,
                                    const std::vector<double>& scores, const std::vector<int32_t>& kv_sizes,
                                    int64_t rows, int64_t k, int32_t dtype) {
  ref64::VsaLayerSelection want;
  want.k = k;
  want.q2k_idx = want_idx;
  want.q2k_num = want_num;
  return ref64::check_selection(fvt::ref_dtype(dtype), got_idx, got_num, scores, kv_sizes, rows, k, &want);
}

using fvt::to_ref;
using fvt::ref_dtype;

ref64::VsaLayerInputs ref_inputs(const LayerCase& c, const LayerInputs& in) {
  ref64::VsaLayerInputs r;
  r.q = to_ref(in.q);
  r.k = to_ref(in.k);
  r.v = to_ref(in.v);
  r.has_gate = c.gate;
  if (c.gate) r.gate = to_ref(in.gate);
  r.q_block_sizes = in.qsz;
  r.kv_block_sizes = in.kvsz;
  return r;
}

std::vector<int32_t> clamped(const std::vector<int32_t>& s) {
  std::vector<int32_t> c(s);
  for (int32_t& x : c) x = std::min(std::max(x, 0), 64);
  return c;
}

// ---- the comparison of one case -------------------------------------------------------------------

void check_outputs_sane(const LayerCase& c, const LayerOutputs& g) {
  for (const HostTensor* t : {&g.out, &g.dq, &g.dk, &g.dv})
    CHECK_MESSAGE(t->padding_intact(), "the GPU wrote into an output's row padding");
  if (c.gate) CHECK_MESSAGE(g.dgate.padding_intact(), "the GPU wrote into dgate's row padding");
}

void check_layer_case(const LayerCase& c) {
  INFO(describe(c));
  MESSAGE(describe(c));
  const LayerInputs in = make_inputs(c);
  const LayerOutputs cpu = cpu_layer(c, in);
  CudaHandle gpu;
  const LayerOutputs g = gpu_layer(gpu.h, c, in);
  check_outputs_sane(c, g);
  const int64_t k = effective_topk(c), rows = c.B * c.Hq * c.nq;

  // The selection: equal to the CPU's but for one-step ties of the float64 scores.
  const ref64::VsaLayerInputs rin = ref_inputs(c, in);
  ref64::VsaLayerConfig rcfg;
  rcfg.topk = c.topk;
  rcfg.softmax_scale = c.scale;
  const ref64::DType dt = ref_dtype(c.dtype);
  const ref64::VsaLayerForward own = ref64::vsa_layer_forward(rcfg, dt, rin);
  const std::vector<int32_t> kvs = clamped(in.kvsz);
  const ref64::SelectionCheck d = compare_lists(g.idx.values_i32(), g.num.values_i32(), cpu.idx.values_i32(),
                                   cpu.num.values_i32(), own.scores, kvs, rows, k, c.dtype);
  CHECK_MESSAGE(d.bad_rows == 0, d.bad_rows << " GPU lists differ from the CPU's; " << d.first_bad);
  if (c.sizes == Sizes::kEmptyKv)
    for (int32_t n : g.num.values_i32()) CHECK_MESSAGE(n == 0, "a list with no kv block of nonzero size");

  if (d.tie_rows == 0) {
    check_close("out (GPU vs CPU)", g.out.values(), cpu.out.values());
    check_close("dq (GPU vs CPU)", g.dq.values(), cpu.dq.values());
    check_close("dk (GPU vs CPU)", g.dk.values(), cpu.dk.values());
    check_close("dv (GPU vs CPU)", g.dv.values(), cpu.dv.values());
    if (c.gate) check_close("dgate (GPU vs CPU)", g.dgate.values(), cpu.dgate.values());
  } else {
    // A tie went the other way: the float64 reference on the GPU's lists is the oracle.
    MESSAGE(d.tie_rows << " q blocks chose the other side of a one-step tie; comparing with reference64");
    ref64::VsaLayerSelection use;
    use.k = k;
    use.q2k_idx = g.idx.values_i32();
    use.q2k_num = g.num.values_i32();
    const ref64::VsaLayerForward rf = ref64::vsa_layer_forward(rcfg, dt, rin, &use);
    const ref64::VsaLayerGrads rg = ref64::vsa_layer_backward(rcfg, dt, rin, rf, to_ref(in.dout));
    check_close("out (GPU vs reference64)", g.out.values(), rf.out.data);
    check_close("dq (GPU vs reference64)", g.dq.values(), rg.dq.data);
    check_close("dk (GPU vs reference64)", g.dk.values(), rg.dk.data);
    check_close("dv (GPU vs reference64)", g.dv.values(), rg.dv.data);
    if (c.gate) check_close("dgate (GPU vs reference64)", g.dgate.values(), rg.dgate.data);
  }
}

LayerCase random_case(const std::string& name) {
  LayerCase c;
  c.name = name;
  c.dtype = uniform(0, 2) == 0 ? FVA_DTYPE_F16 : FVA_DTYPE_BF16;
  c.B = uniform(1, 2);
  c.Hkv = uniform(1, 2);
  c.Hq = c.Hkv * uniform(1, 3);
  c.nq = uniform(1, 7);
  c.nkv = uniform(1, 9);
  c.D = uniform(0, 1) ? 128 : 64;
  const int64_t t = uniform(0, 3);
  c.topk = t == 0 ? 1 : t == 1 ? c.nkv : t == 2 ? c.nkv + uniform(1, 5) : uniform(1, c.nkv);
  c.gate = uniform(0, 1) == 1;
  c.layout = uniform(0, 1) ? Layout::BSHD : Layout::BHSD;
  c.pad = uniform(0, 2) == 0 ? 8 * uniform(1, 2) : 0;
  if (uniform(0, 4) == 0) c.scale = 0.05 + 0.3 * std::uniform_real_distribution<double>(0, 1)(rng());
  return c;
}

}  // namespace

// ---- against the CPU backend ------------------------------------------------------------------------

TEST_CASE("GPU VSA layer matches the CPU backend (random shapes: ragged and empty blocks, GQA, every topk)") {
  const int reps = quick() ? 3 : 12;
  for (int rep = 0; rep < reps; ++rep)
    SUBCASE(("random #" + std::to_string(rep)).c_str()) { check_layer_case(random_case("random")); }
}

TEST_CASE("GPU VSA layer at fixed corners: topk 1, topk = nkv, topk > nkv, every kv block empty, D 64/128, f16/bf16") {
  std::vector<LayerCase> cases;
  {
    LayerCase c;
    c.name = "topk 1, GQA 4/2, f16 D128, gate";
    c.dtype = FVA_DTYPE_F16, c.B = 1, c.Hq = 4, c.Hkv = 2, c.nq = 5, c.nkv = 6, c.D = 128, c.topk = 1, c.gate = true;
    cases.push_back(c);
  }
  {
    LayerCase c;
    c.name = "topk = nkv, bf16 D64, no gate, BSHD padded";
    c.B = 2, c.Hq = 2, c.Hkv = 2, c.nq = 3, c.nkv = 4, c.D = 64, c.topk = 4, c.layout = Layout::BSHD, c.pad = 8;
    cases.push_back(c);
  }
  {
    LayerCase c;
    c.name = "topk > nkv, bf16 D128, gate, nq > nkv";
    c.B = 1, c.Hq = 3, c.Hkv = 1, c.nq = 9, c.nkv = 2, c.D = 128, c.topk = 7, c.gate = true;
    cases.push_back(c);
  }
  {
    LayerCase c;
    c.name = "every kv block empty, f16 D64, gate";
    c.dtype = FVA_DTYPE_F16, c.Hq = 2, c.Hkv = 1, c.nq = 3, c.nkv = 4, c.D = 64, c.topk = 2, c.gate = true;
    c.sizes = Sizes::kEmptyKv;
    cases.push_back(c);
  }
  {
    LayerCase c;
    c.name = "full blocks, bf16 D128, no gate, explicit scale";
    c.B = 1, c.Hq = 2, c.Hkv = 2, c.nq = 4, c.nkv = 5, c.D = 128, c.topk = 2, c.scale = 0.3, c.sizes = Sizes::kFull;
    cases.push_back(c);
  }
  for (const LayerCase& c : cases)
    SUBCASE(c.name.c_str()) { check_layer_case(c); }
}

// Several 16-row tiles of the coarse kernels, their products' staged operands in one chunk and in
// several (vsa_layer/coarse_tiles.cuh), 32-entry chunks of the selection's scan, and rows whose scores tie exactly (copies of kv block 0), so the
// radix select's threshold bin holds many equal keys and the lowest indices must win.
TEST_CASE("GPU VSA layer at longer sequences: several coarse tiles, tied scores, many kv blocks") {
  std::vector<LayerCase> cases;
  {
    LayerCase c;
    c.name = "long, tied kv blocks, bf16 D128, gate";
    c.B = 1, c.Hq = 2, c.Hkv = 1, c.nq = quick() ? 20 : 37, c.nkv = quick() ? 70 : 150, c.D = 128;
    c.topk = 13, c.gate = true, c.tied_kv = 24;
    cases.push_back(c);
  }
  {
    LayerCase c;
    c.name = "long, f16 D64, no gate, BSHD";
    c.dtype = FVA_DTYPE_F16, c.B = 2, c.Hq = 2, c.Hkv = 2, c.nq = quick() ? 17 : 40, c.nkv = quick() ? 66 : 200;
    c.D = 64, c.topk = 31, c.layout = Layout::BSHD;
    cases.push_back(c);
  }
  if (!quick()) {
    LayerCase c;
    c.name = "long, topk > nkv, bf16 D64, gate, tied";
    c.B = 1, c.Hq = 1, c.Hkv = 1, c.nq = 33, c.nkv = 97, c.D = 64, c.topk = 120, c.gate = true, c.tied_kv = 40;
    cases.push_back(c);
  }
  {
    // More q blocks than the coarse backward's kv side stages at once (176 at D = 128 on a GPU
    // with 228 KiB of shared memory an SM, fewer on the others), over a GQA group.
    LayerCase c;
    c.name = "many q blocks (the coarse kv side in chunks), bf16 D128, GQA, gate";
    c.B = 1, c.Hq = 2, c.Hkv = 1, c.nq = 200, c.nkv = 20, c.D = 128, c.topk = 5, c.gate = true;
    cases.push_back(c);
  }
  {
    // Past kern::kLayerCoarseSmemMaxKv (1024) kv blocks the coarse kernels work on their rows'
    // global home instead of shared memory, and their products take k_c and v_c in chunks.
    LayerCase c;
    c.name = "many kv blocks (coarse rows in global memory), bf16 D64, GQA, gate";
    c.B = 1, c.Hq = 2, c.Hkv = 1, c.nq = 18, c.nkv = 1030, c.D = 64, c.topk = 40, c.gate = true;
    cases.push_back(c);
  }
  for (const LayerCase& c : cases)
    SUBCASE(c.name.c_str()) { check_layer_case(c); }
}

// ---- against golden ---------------------------------------------------------------------------------

TEST_CASE("GPU VSA layer against tests/golden/vsa_layer (FastVideo's video_sparse_attn)") {
  const std::vector<GoldenCase> cases = list_golden("vsa_layer");
  REQUIRE(cases.size() >= 2);
  CudaHandle gpu;
  for (const GoldenCase& gc : cases) {
    SUBCASE(gc.name.c_str()) {
      INFO("golden vsa_layer/" << gc.name);
      const ref64::Tensor q = golden_tensor(gc, "q"), k = golden_tensor(gc, "k"), v = golden_tensor(gc, "v"),
                          dout = golden_tensor(gc, "do");
      const std::vector<int32_t> vbs = golden_i32(gc, "vbs");
      LayerCase c;
      c.name = gc.name;
      c.B = q.shape.B, c.Hq = c.Hkv = q.shape.H, c.D = q.shape.D;
      c.nq = q.shape.S / kBlock, c.nkv = k.shape.S / kBlock;
      c.topk = gc.topk, c.gate = gc.gate;
      REQUIRE(static_cast<int64_t>(vbs.size()) == c.nq);  // golden's vbs serves q and kv blocks alike
      auto bf16 = [](const ref64::Tensor& t) {
        HostTensor x(FVA_DTYPE_BF16, {t.shape.B, t.shape.H, t.shape.S, t.shape.D});
        x.fill(t.data);
        return x;
      };
      LayerInputs in{bf16(q), bf16(k), bf16(v), HostTensor(FVA_DTYPE_BF16, {c.B, c.Hq, c.nq * kBlock, c.D}),
                     bf16(dout), HostTensor(FVA_DTYPE_I32, {c.nq}), HostTensor(FVA_DTYPE_I32, {c.nkv}), vbs, vbs};
      if (gc.gate) in.gate = bf16(golden_tensor(gc, "gate"));
      in.q_sizes.fill_i32(vbs);
      in.kv_sizes.fill_i32(vbs);
      const LayerOutputs g = gpu_layer(gpu.h, c, in);
      const int64_t kk = effective_topk(c), rows = c.B * c.Hq * c.nq;
      const ref64::SelectionCheck d = compare_lists(g.idx.values_i32(), g.num.values_i32(), golden_i32(gc, "q2k_idx"),
                                       golden_i32(gc, "q2k_num"), golden_tensor(gc, "scores").data, clamped(vbs),
                                       rows, kk, FVA_DTYPE_BF16);
      CHECK_MESSAGE(d.bad_rows == 0, d.bad_rows << " lists differ from golden's; " << d.first_bad);
      MESSAGE(gc.name << ": " << d.tie_rows << " q blocks on the other side of a one-step tie");
      check_close("out vs golden", g.out.values(), golden_tensor(gc, "out").data);
      check_close("dq vs golden", g.dq.values(), golden_tensor(gc, "dq").data);
      check_close("dk vs golden", g.dk.values(), golden_tensor(gc, "dk").data);
      check_close("dv vs golden", g.dv.values(), golden_tensor(gc, "dv").data);
      if (gc.gate) check_close("dgate vs golden", g.dgate.values(), golden_tensor(gc, "dgate").data);
    }
  }
}

// ---- determinism, graphs, optional outputs -------------------------------------------------------------

TEST_CASE("GPU VSA layer: bitwise reproducible, replays from a CUDA graph, q2k outputs optional") {
  LayerCase c = random_case("graph");
  c.nq = 6, c.nkv = 9, c.topk = 4, c.gate = true;
  INFO(describe(c));
  const LayerInputs in = make_inputs(c);
  CudaHandle gpu;
  const LayerOutputs direct = gpu_layer(gpu.h, c, in);
  const LayerOutputs again = gpu_layer(gpu.h, c, in);
  for (auto m : {&LayerOutputs::out, &LayerOutputs::dq, &LayerOutputs::dk, &LayerOutputs::dv, &LayerOutputs::dgate})
    CHECK_MESSAGE((direct.*m).bits16() == (again.*m).bits16(), "two identical runs differ");
  CHECK(direct.idx.values_i32() == again.idx.values_i32());

  // Forward (without the lists) and backward captured in one graph on a non-default stream.
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  LayerOutputs o = empty_outputs(c);
  {
    GpuLayer g(gpu.h, c, in);
    DeviceTensor out(o.out), dq(o.dq), dk(o.dk), dv(o.dv), dgate(o.dgate);
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const fva_status_t s1 = g.forward(out, nullptr, nullptr, stream);
    const fva_status_t s2 = g.backward(dq, dk, dv, dgate, stream);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    REQUIRE_MESSAGE(s1 == FVA_OK, fva_last_error());
    REQUIRE_MESSAGE(s2 == FVA_OK, fva_last_error());
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
      CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      out.download(o.out);
      dq.download(o.dq);
      dk.download(o.dk);
      dv.download(o.dv);
      dgate.download(o.dgate);
      CHECK_MESSAGE(o.out.bits16() == direct.out.bits16(), "graph replay " << replay << ": out differs");
      CHECK_MESSAGE(o.dq.bits16() == direct.dq.bits16(), "graph replay " << replay << ": dq differs");
      CHECK_MESSAGE(o.dk.bits16() == direct.dk.bits16(), "graph replay " << replay << ": dk differs");
      CHECK_MESSAGE(o.dv.bits16() == direct.dv.bits16(), "graph replay " << replay << ": dv differs");
      CHECK_MESSAGE(o.dgate.bits16() == direct.dgate.bits16(), "graph replay " << replay << ": dgate differs");
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

// ---- the reserve's record -----------------------------------------------------------------------------

// Every byte of the host copy is still 0xFF (the poison of a fresh HostTensor).
bool untouched(const HostTensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  return std::all_of(p, p + t.bytes(), [](uint8_t b) { return b == 0xFF; });
}

TEST_CASE("GPU VSA layer backward leaves every output untouched for a reserve of another forward") {
  LayerCase base;
  base.name = "reserve";
  base.dtype = FVA_DTYPE_BF16, base.B = 1, base.Hq = 2, base.Hkv = 1, base.nq = 4, base.nkv = 5, base.D = 64;
  base.topk = 3, base.gate = true;
  const LayerInputs in = make_inputs(base);
  CudaHandle gpu;

  // The forward whose reserve the backward gets: another gate setting, topk, scale, or shape.
  struct Variant {
    const char* what;
    LayerCase c;
  };
  std::vector<Variant> variants;
  {
    LayerCase c = base;
    c.gate = false;
    variants.push_back({"written without the gate", c});
  }
  {
    LayerCase c = base;
    c.topk = 2;
    variants.push_back({"written with another topk", c});
  }
  {
    LayerCase c = base;
    c.scale = 0.2;
    variants.push_back({"written with another softmax scale", c});
  }
  {
    LayerCase c = base;
    c.nq = 3;  // a smaller problem, so its reserve is copied into one of the right size below
    variants.push_back({"written for fewer q blocks", c});
  }
  {
    LayerCase c = base;
    c.dtype = FVA_DTYPE_F16;
    variants.push_back({"written for f16", c});
  }
  GpuLayer right(gpu.h, base, in);
  for (const Variant& var : variants) {
    SUBCASE(var.what) {
      INFO(var.what);
      const LayerInputs vin = make_inputs(var.c);
      GpuLayer other(gpu.h, var.c, vin);
      LayerOutputs vo = empty_outputs(var.c);
      DeviceTensor vout(vo.out);
      REQUIRE_OK(other.forward(vout, nullptr, nullptr));
      // The other forward's reserve, in a buffer the size this backward asks for (the host can
      // only check the size; the kernels must notice the rest).
      DeviceBuffer reserve(std::max(right.res_bytes, other.res_bytes), 0xFF);
      cuda::synchronize();
      std::vector<uint8_t> bytes(other.res_bytes);
      cuda::copy_to_host(bytes.data(), other.res.data(), bytes.size());
      cuda::copy_to_device(reserve.data(), bytes.data(), bytes.size());
      LayerOutputs o = empty_outputs(base);
      DeviceTensor dq(o.dq), dk(o.dk), dv(o.dv), dgate(o.dgate);
      REQUIRE_OK(right.backward(dq, dk, dv, dgate, nullptr, reserve.data(), reserve.size()));
      dq.download(o.dq);
      dk.download(o.dk);
      dv.download(o.dv);
      dgate.download(o.dgate);
      CHECK_MESSAGE(untouched(o.dq), "dq was written");
      CHECK_MESSAGE(untouched(o.dk), "dk was written");
      CHECK_MESSAGE(untouched(o.dv), "dv was written");
      CHECK_MESSAGE(untouched(o.dgate), "dgate was written");
    }
  }
  SUBCASE("a reserve no forward wrote") {
    LayerOutputs o = empty_outputs(base);
    DeviceTensor dq(o.dq), dk(o.dk), dv(o.dv), dgate(o.dgate);
    DeviceBuffer never(right.res_bytes, 0xFF);
    REQUIRE_OK(right.backward(dq, dk, dv, dgate, nullptr, never.data(), never.size()));
    dq.download(o.dq);
    dk.download(o.dk);
    dv.download(o.dv);
    dgate.download(o.dgate);
    CHECK(untouched(o.dq));
    CHECK(untouched(o.dk));
    CHECK(untouched(o.dv));
    CHECK(untouched(o.dgate));
  }
  SUBCASE("the right reserve, after a refused one: written, and equal to the CPU backend") {
    LayerOutputs o = empty_outputs(base);
    DeviceTensor out(o.out), idx(o.idx), num(o.num), dq(o.dq), dk(o.dk), dv(o.dv), dgate(o.dgate);
    REQUIRE_OK(right.forward(out, &idx, &num));
    DeviceBuffer never(right.res_bytes, 0xFF);
    REQUIRE_OK(right.backward(dq, dk, dv, dgate, nullptr, never.data(), never.size()));
    REQUIRE_OK(right.backward(dq, dk, dv, dgate));
    out.download(o.out);
    dq.download(o.dq);
    dk.download(o.dk);
    dv.download(o.dv);
    dgate.download(o.dgate);
    idx.download(o.idx);
    const LayerOutputs cpu = cpu_layer(base, in);
    if (o.idx.values_i32() == cpu.idx.values_i32()) {
      check_close("out", o.out.values(), cpu.out.values());
      check_close("dq", o.dq.values(), cpu.dq.values());
      check_close("dk", o.dk.values(), cpu.dk.values());
      check_close("dv", o.dv.values(), cpu.dv.values());
      check_close("dgate", o.dgate.values(), cpu.dgate.values());
    } else {
      for (const HostTensor* t : {&o.dq, &o.dk, &o.dv, &o.dgate})
        CHECK_MESSAGE(!has_nan(t->values()), "an output was left poisoned");
    }
  }
}

