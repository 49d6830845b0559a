// The whole VSA layer (SPEC section 3b) on the CPU backend, through the public API:
//   - against tests/golden/vsa_layer (FastVideo's own video_sparse_attn): block means bit for bit
//     (read from the CPU reserve, whose layout src/cpu/vsa_layer_reserve.h gives), the selected lists
//     equal up to SPEC 3b's one exception, out, dq, dk, dv and dgate within SPEC 4's 1e-2; and
//     reference64's float64 implementation of 3b against the same data;
//   - against reference64 on random inputs from a fresh seed every run (ragged and empty blocks,
//     nq != nkv, GQA, D 64 and 128, bf16 and f16, topk 1 and >= nkv, gate or not, BSHD views),
//     outputs poisoned before every call, NaN never passing; the same bits on 1 and 3 threads;
//   - fva_vsa_tile_plan against FastVideo's tiling written out directly.
// The library's selection is checked against the reference's scores first; the reference then
// runs its fine branch on the library's lists, so that a legitimate tie-break cannot fail the rest.
#include <doctest/doctest.h>
#include <fvattn/fvattn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/vsa_layer_reserve.h"
#include "reference64.h"
#include "support/api_fixtures.h"
#include "support/golden.h"
#include "support/host_tensor.h"
#include "support/reference_bridge.h"

namespace {

using fvt::HostTensor;
using fvt::Layout;

constexpr double kTol = 1e-2;  // SPEC section 4: out, dq, dk, dv, dgate
constexpr int64_t kBlock = 64;

using fvt::ref_dtype;

using fvt::to_ref;

bool verbose() {
  static const bool v = std::getenv("FVATTN_TEST_VERBOSE") != nullptr;
  return v;
}

double check_close(const std::string& what, const std::vector<double>& got, const std::vector<double>& ref,
                   double tol = kTol) {
  const int64_t nans = fvt::count_nan(got);
  CHECK_MESSAGE(nans == 0, what << ": " << nans << " NaN elements (poisoned or computed)");
  const double e = fvt::rel_l2(got, ref);
  CHECK_MESSAGE(e <= tol, what << ": rel L2 " << e << " > " << tol);
  if (verbose()) MESSAGE(what << ": rel L2 " << e);
  return e;
}

// ---- the selection rule (SPEC 3b) ------------------------------------------------------------------

// A library selection against the one SPEC 3b defines for reference scores `scores` ([rows, nkv],
// rows = B * H * nq), one-step ties allowed (ref64::check_selection).
ref64::SelectionCheck check_selection(const std::vector<int32_t>& lib_idx, const std::vector<int32_t>& lib_num,
                                      const std::vector<double>& scores, const std::vector<int32_t>& kv_sizes,
                                      int64_t rows, int64_t k, int32_t dtype) {
  return ref64::check_selection(ref_dtype(dtype), lib_idx, lib_num, scores, kv_sizes, rows, k);
}

// ---- calling the library ---------------------------------------------------------------------------

// One layer problem's tensors and the calls on it.
struct Layer {
  fva_handle_t h;
  fva_vsa_layer_config_t cfg = FVA_VSA_LAYER_CONFIG_INIT;
  const HostTensor *q, *k, *v, *gate, *q_sizes, *kv_sizes;
  size_t ws_bytes = 0, reserve_bytes = 0;
  fvt::AlignedBuffer reserve;

  Layer(fva_handle_t handle, int64_t topk, double scale, const HostTensor& q_, const HostTensor& k_,
        const HostTensor& v_, const HostTensor* gate_, const HostTensor& qs, const HostTensor& kvs)
      : h(handle), q(&q_), k(&k_), v(&v_), gate(gate_), q_sizes(&qs), kv_sizes(&kvs) {
    cfg.topk = static_cast<int32_t>(topk);
    cfg.softmax_scale = static_cast<float>(scale);
    REQUIRE_OK(fva_vsa_layer_sizes(h, &cfg, q->t(), k->t(), v->t(), &ws_bytes, &reserve_bytes));
    reserve = fvt::workspace(reserve_bytes);  // 0xFF bytes: nothing in it may be trusted
  }
  int64_t k_eff() const { return std::min<int64_t>(cfg.topk, k->shape()[2] / kBlock); }

  void forward(HostTensor& out, HostTensor& idx, HostTensor& num) {
    fvt::AlignedBuffer ws = fvt::workspace(ws_bytes);
    out.poison();
    idx.poison();
    num.poison();
    REQUIRE_OK(fva_vsa_layer_forward(h, &cfg, q->t(), k->t(), v->t(), gate ? gate->t() : nullptr,
                                     q_sizes->t(), kv_sizes->t(), out.t(), idx.t(), num.t(),
                                     reserve.data(), reserve_bytes, ws.data(), ws_bytes, nullptr));
  }
  void backward(const HostTensor& dout, HostTensor& dq, HostTensor& dk, HostTensor& dv, HostTensor* dgate) {
    fvt::AlignedBuffer ws = fvt::workspace(ws_bytes);
    dq.poison();
    dk.poison();
    dv.poison();
    if (dgate) dgate->poison();
    REQUIRE_OK(fva_vsa_layer_backward(h, &cfg, q->t(), k->t(), v->t(), gate ? gate->t() : nullptr,
                                      q_sizes->t(), kv_sizes->t(), dout.t(), reserve.data(), reserve_bytes,
                                      dq.t(), dk.t(), dv.t(), dgate ? dgate->t() : nullptr, ws.data(),
                                      ws_bytes, nullptr));
  }
  // A region of the CPU reserve ([count] 16-bit values at byte offset `at`).
  std::vector<uint16_t> reserve_bits(size_t at, size_t count) const {
    std::vector<uint16_t> out(count);
    std::memcpy(out.data(), static_cast<const char*>(reserve.data()) + at, count * 2);
    return out;
  }
};

fva::VsaLayerProblem layout_problem(int32_t dtype, int64_t B, int64_t Hq, int64_t Hkv, int64_t nq, int64_t nkv,
                                    int64_t D, int64_t k_eff) {
  fva::VsaLayerProblem p;
  p.fine.dtype = dtype;
  p.fine.B = B;
  p.fine.Hq = Hq;
  p.fine.Hkv = Hkv;
  p.fine.num_q_blocks = nq;
  p.fine.num_kv_blocks = nkv;
  p.fine.D = D;
  p.fine.max_k = k_eff;
  p.topk = k_eff;
  return p;
}

// ---- golden ------------------------------------------------------------------------------------------

TEST_CASE("golden VSA layer cases through the public API (CPU backend), and reference64 against them") {
  const std::vector<fvt::GoldenCase> cases = fvt::list_golden("vsa_layer");
  REQUIRE(cases.size() >= 2);
  fvt::CpuHandle h;
  for (const fvt::GoldenCase& gc : cases) {
    INFO("golden vsa_layer/" << gc.name);
    const ref64::Tensor q = fvt::golden_tensor(gc, "q"), k = fvt::golden_tensor(gc, "k"),
                        v = fvt::golden_tensor(gc, "v"), dout = fvt::golden_tensor(gc, "do");
    const ref64::Tensor g_out = fvt::golden_tensor(gc, "out"), g_dq = fvt::golden_tensor(gc, "dq"),
                        g_dk = fvt::golden_tensor(gc, "dk"), g_dv = fvt::golden_tensor(gc, "dv");
    const std::vector<int32_t> vbs = fvt::golden_i32(gc, "vbs");
    const int64_t B = q.shape.B, H = q.shape.H, D = q.shape.D, nq = q.shape.S / kBlock, nkv = k.shape.S / kBlock;
    REQUIRE(static_cast<int64_t>(vbs.size()) == nq);  // golden's vbs serves q and kv blocks alike
    const std::vector<double> g_scores = fvt::golden_tensor(gc, "scores").data;
    const std::vector<int32_t> g_idx = fvt::golden_i32(gc, "q2k_idx"), g_num = fvt::golden_i32(gc, "q2k_num");

    auto bf16 = [](const ref64::Tensor& t) {
      HostTensor x(FVA_DTYPE_BF16, {t.shape.B, t.shape.H, t.shape.S, t.shape.D});
      x.fill(t.data);
      return x;
    };
    const HostTensor hq = bf16(q), hk = bf16(k), hv = bf16(v), hdo = bf16(dout);
    HostTensor hgate;
    if (gc.gate) hgate = bf16(fvt::golden_tensor(gc, "gate"));
    HostTensor sizes(FVA_DTYPE_I32, {nq});
    sizes.fill_i32(vbs);

    Layer layer(h.h, gc.topk, 0.0, hq, hk, hv, gc.gate ? &hgate : nullptr, sizes, sizes);
    const int64_t kk = layer.k_eff();
    HostTensor out(FVA_DTYPE_BF16, hq.shape()), idx(FVA_DTYPE_I32, {B, H, nq, kk}), num(FVA_DTYPE_I32, {B, H, nq});
    layer.forward(out, idx, num);

    // Block means: bit for bit.
    const fva::cpu::VsaLayerReserveLayout lay =
        fva::cpu::vsa_layer_reserve_layout(layout_problem(FVA_DTYPE_BF16, B, H, H, nq, nkv, D, kk));
    CHECK(layer.reserve_bits(lay.q_c, static_cast<size_t>(B * H * nq * D)) == fvt::golden_bits(gc, "q_c"));
    CHECK(layer.reserve_bits(lay.k_c, static_cast<size_t>(B * H * nkv * D)) == fvt::golden_bits(gc, "k_c"));
    CHECK(layer.reserve_bits(lay.v_c, static_cast<size_t>(B * H * nkv * D)) == fvt::golden_bits(gc, "v_c"));

    // Selection: golden's lists, up to SPEC 3b's exception (judged on golden's scores).
    const ref64::SelectionCheck sel =
        check_selection(idx.values_i32(), num.values_i32(), g_scores, vbs, B * H * nq, gc.topk, FVA_DTYPE_BF16);
    CHECK_MESSAGE(sel.bad_rows == 0, sel.bad_rows << " selected lists break SPEC 3b; " << sel.first_bad);
    int64_t equal_rows = 0;
    const std::vector<int32_t> li = idx.values_i32(), ln = num.values_i32();
    for (int64_t r = 0; r < B * H * nq; ++r)
      equal_rows += ln[r] == g_num[r] && std::equal(li.begin() + r * kk, li.begin() + (r + 1) * kk, g_idx.begin() + r * kk);

    HostTensor dq(FVA_DTYPE_BF16, hq.shape()), dk(FVA_DTYPE_BF16, hk.shape()), dv(FVA_DTYPE_BF16, hv.shape()),
        dgate(FVA_DTYPE_BF16, hq.shape());
    layer.backward(hdo, dq, dk, dv, gc.gate ? &dgate : nullptr);
    const double eo = check_close("library out vs golden", out.values(), g_out.data);
    const double eq = check_close("library dq vs golden", dq.values(), g_dq.data);
    const double ek = check_close("library dk vs golden", dk.values(), g_dk.data);
    const double ev = check_close("library dv vs golden", dv.values(), g_dv.data);
    double eg = 0.0;
    if (gc.gate) eg = check_close("library dgate vs golden", dgate.values(), fvt::golden_tensor(gc, "dgate").data);
    MESSAGE(gc.name << ": library vs golden: out " << eo << ", dq " << eq << ", dk " << ek << ", dv " << ev
                    << ", dgate " << (gc.gate ? std::to_string(eg) : std::string("(no gate)")) << "; lists equal in "
                    << equal_rows << " of " << B * H * nq << " q blocks (" << sel.tie_rows << " one-step ties)");

    // reference64 (float64, its own selection) against golden.
    ref64::VsaLayerInputs in;
    in.q = q, in.k = k, in.v = v;
    in.has_gate = gc.gate;
    if (gc.gate) in.gate = fvt::golden_tensor(gc, "gate");
    in.q_block_sizes = in.kv_block_sizes = vbs;
    ref64::VsaLayerConfig rcfg;
    rcfg.topk = gc.topk;
    const ref64::VsaLayerForward rf = ref64::vsa_layer_forward(rcfg, ref64::DType::BF16, in);
    const ref64::SelectionCheck rsel = check_selection(rf.selection.q2k_idx, rf.selection.q2k_num, g_scores, vbs,
                                                B * H * nq, gc.topk, FVA_DTYPE_BF16);
    CHECK_MESSAGE(rsel.bad_rows == 0, "reference64: " << rsel.first_bad);
    check_close("reference64 out vs golden", rf.out.data, g_out.data);
    const ref64::VsaLayerGrads rg = ref64::vsa_layer_backward(rcfg, ref64::DType::BF16, in, rf, dout);
    check_close("reference64 dq vs golden", rg.dq.data, g_dq.data);
    check_close("reference64 dk vs golden", rg.dk.data, g_dk.data);
    check_close("reference64 dv vs golden", rg.dv.data, g_dv.data);
    if (gc.gate) check_close("reference64 dgate vs golden", rg.dgate.data, fvt::golden_tensor(gc, "dgate").data);
  }
}

// ---- random problems against reference64 ---------------------------------------------------------------

struct Shape3b {
  const char* name;
  int32_t dtype;
  int64_t B, Hq, Hkv, nq, nkv, D, topk;
  bool gate;
  Layout layout = Layout::BHSD;
  double scale = 0.0;        // 0: 1/sqrt(D)
  bool empty_kv = false;     // every kv block of size 0
};

// Block sizes: mostly full or ragged, some empty (at least one kv block non-empty unless asked).
std::vector<int32_t> random_sizes(std::mt19937_64& rng, int64_t n, bool all_empty, bool keep_one) {
  std::vector<int32_t> s(static_cast<size_t>(n));
  for (int32_t& x : s) {
    const int r = static_cast<int>(rng() % 10);
    x = all_empty ? 0 : r < 4 ? 64 : r < 8 ? 1 + static_cast<int32_t>(rng() % 63) : 0;
  }
  if (!all_empty && keep_one && std::all_of(s.begin(), s.end(), [](int32_t x) { return x == 0; }))
    s[static_cast<size_t>(rng() % static_cast<uint64_t>(n))] = 37;
  return s;
}

struct LibRun {
  std::vector<double> out, dq, dk, dv, dgate;
  std::vector<int32_t> idx, num;
  std::vector<uint16_t> bits;  // every output's bits, for the determinism check
};

LibRun run_library(fva_handle_t h, const Shape3b& c, const HostTensor& q, const HostTensor& k,
                   const HostTensor& v, const HostTensor* gate, const HostTensor& qs, const HostTensor& kvs,
                   const HostTensor& dout) {
  Layer layer(h, c.topk, c.scale, q, k, v, gate, qs, kvs);
  const int64_t kk = layer.k_eff();
  HostTensor out(c.dtype, q.shape(), c.layout, 8), idx(FVA_DTYPE_I32, {c.B, c.Hq, c.nq, kk}),
      num(FVA_DTYPE_I32, {c.B, c.Hq, c.nq});
  layer.forward(out, idx, num);
  HostTensor dq(c.dtype, q.shape(), c.layout, 8), dk(c.dtype, k.shape(), c.layout, 8),
      dv(c.dtype, v.shape(), c.layout, 8), dgate(c.dtype, q.shape(), c.layout, 8);
  layer.backward(dout, dq, dk, dv, gate ? &dgate : nullptr);
  for (const HostTensor* t : {&out, &dq, &dk, &dv, &dgate})
    CHECK_MESSAGE(t->padding_intact(), "an output's row padding was written");
  LibRun r{out.values(), dq.values(), dk.values(), dv.values(), gate ? dgate.values() : std::vector<double>{},
           idx.values_i32(), num.values_i32(), {}};
  for (const HostTensor* t : {&out, &dq, &dk, &dv}) {
    const std::vector<uint16_t> b = t->bits16();
    r.bits.insert(r.bits.end(), b.begin(), b.end());
  }
  if (gate) {
    const std::vector<uint16_t> b = dgate.bits16();
    r.bits.insert(r.bits.end(), b.begin(), b.end());
  }
  return r;
}

fva_handle_t cpu_handle(int threads) {
  fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = FVA_BACKEND_CPU;
  o.cpu_threads = threads;
  fva_handle_t h = nullptr;
  REQUIRE(fva_create(&h, &o) == FVA_OK);
  return h;
}

TEST_CASE("VSA layer against reference64 on random problems (fresh seed each run)") {
  const std::vector<Shape3b> shapes = {
      {"bf16 D64 ragged, gate, nq != nkv", FVA_DTYPE_BF16, 1, 2, 2, 3, 5, 64, 2, true},
      {"f16 D128 GQA 4/2, topk 1, no gate", FVA_DTYPE_F16, 2, 4, 2, 4, 3, 128, 1, false},
      {"bf16 D128 topk > nkv, gate, BSHD", FVA_DTYPE_BF16, 1, 2, 1, 2, 4, 128, 10, true, Layout::BSHD},
      {"f16 D64 GQA 3/1, topk = nkv, gate", FVA_DTYPE_F16, 1, 3, 1, 5, 2, 64, 2, true},
      {"bf16 D64 explicit scale, no gate, BSHD", FVA_DTYPE_BF16, 2, 1, 1, 2, 6, 64, 3, false, Layout::BSHD, 0.3},
      {"bf16 D128 every kv block empty, gate", FVA_DTYPE_BF16, 1, 2, 2, 2, 3, 128, 2, true, Layout::BHSD, 0.0, true},
  };
  std::mt19937_64 rng(fvt::test_seed() ^ 0x3b3b3b3bull);
  fva_handle_t h1 = cpu_handle(1), h3 = cpu_handle(3);
  for (const Shape3b& c : shapes) {
    INFO(std::string(c.name));
    const std::vector<int64_t> qshape{c.B, c.Hq, c.nq * kBlock, c.D}, kshape{c.B, c.Hkv, c.nkv * kBlock, c.D};
    HostTensor q(c.dtype, qshape, c.layout), k(c.dtype, kshape, c.layout), v(c.dtype, kshape, c.layout),
        gate(c.dtype, qshape, c.layout), dout(c.dtype, qshape, c.layout);
    // Padding slots hold values too: the block means must not read them, the fine branch must mask them.
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    gate.fill_normal(rng, 0.5, 0.5);
    dout.fill_normal(rng);
    const std::vector<int32_t> qsz = random_sizes(rng, c.nq, false, false),
                               kvsz = random_sizes(rng, c.nkv, c.empty_kv, true);
    HostTensor qs(FVA_DTYPE_I32, {c.nq}), kvs(FVA_DTYPE_I32, {c.nkv});
    qs.fill_i32(qsz);
    kvs.fill_i32(kvsz);
    const HostTensor* g = c.gate ? &gate : nullptr;

    const LibRun lib = run_library(h3, c, q, k, v, g, qs, kvs, dout);
    const LibRun lib1 = run_library(h1, c, q, k, v, g, qs, kvs, dout);
    CHECK_MESSAGE(lib.bits == lib1.bits, "results differ between 1 and 3 threads");
    CHECK(lib.idx == lib1.idx);

    ref64::VsaLayerInputs in;
    in.q = to_ref(q), in.k = to_ref(k), in.v = to_ref(v);
    in.has_gate = c.gate;
    if (c.gate) in.gate = to_ref(gate);
    in.q_block_sizes = qsz;
    in.kv_block_sizes = kvsz;
    ref64::VsaLayerConfig rcfg;
    rcfg.topk = c.topk;
    rcfg.softmax_scale = c.scale;
    const ref64::DType dt = ref_dtype(c.dtype);
    const ref64::VsaLayerForward own = ref64::vsa_layer_forward(rcfg, dt, in);
    const ref64::SelectionCheck sel =
        check_selection(lib.idx, lib.num, own.scores, kvsz, c.B * c.Hq * c.nq, c.topk, c.dtype);
    CHECK_MESSAGE(sel.bad_rows == 0, sel.bad_rows << " selected lists break SPEC 3b; " << sel.first_bad);
    if (sel.tie_rows) MESSAGE(c.name << ": " << sel.tie_rows << " q blocks chose the other side of a one-step tie");
    if (c.empty_kv)
      CHECK(std::all_of(lib.num.begin(), lib.num.end(), [](int32_t n) { return n == 0; }));

    ref64::VsaLayerSelection use;
    use.k = std::min(c.topk, c.nkv);
    use.q2k_idx = lib.idx;
    use.q2k_num = lib.num;
    const ref64::VsaLayerForward rf = ref64::vsa_layer_forward(rcfg, dt, in, &use);
    check_close("out", lib.out, rf.out.data);
    const ref64::VsaLayerGrads rg = ref64::vsa_layer_backward(rcfg, dt, in, rf, to_ref(dout));
    check_close("dq", lib.dq, rg.dq.data);
    check_close("dk", lib.dk, rg.dk.data);
    check_close("dv", lib.dv, rg.dv.data);
    if (c.gate) check_close("dgate", lib.dgate, rg.dgate.data);
  }
  fva_destroy(h1);
  fva_destroy(h3);
}

TEST_CASE("VSA layer: q2k outputs are optional, the reserve alone carries the selection") {
  fvt::CpuHandle h;
  std::mt19937_64 rng(fvt::test_seed() ^ 0x51ull);
  const int64_t nq = 2, nkv = 3, D = 64;
  HostTensor q(FVA_DTYPE_BF16, {1, 1, nq * kBlock, D}), k(FVA_DTYPE_BF16, {1, 1, nkv * kBlock, D}),
      v(FVA_DTYPE_BF16, {1, 1, nkv * kBlock, D}), dout(FVA_DTYPE_BF16, {1, 1, nq * kBlock, D});
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  dout.fill_normal(rng);
  HostTensor qs(FVA_DTYPE_I32, {nq}), kvs(FVA_DTYPE_I32, {nkv});
  qs.fill_i32({64, 20});
  kvs.fill_i32({64, 0, 33});
  Layer a(h.h, 1, 0.0, q, k, v, nullptr, qs, kvs), b(h.h, 1, 0.0, q, k, v, nullptr, qs, kvs);
  HostTensor out1(FVA_DTYPE_BF16, q.shape()), out2(FVA_DTYPE_BF16, q.shape()), idx(FVA_DTYPE_I32, {1, 1, nq, 1}),
      num(FVA_DTYPE_I32, {1, 1, nq});
  a.forward(out1, idx, num);
  fvt::AlignedBuffer ws = fvt::workspace(b.ws_bytes);
  REQUIRE_OK(fva_vsa_layer_forward(h.h, &b.cfg, q.t(), k.t(), v.t(), nullptr, qs.t(), kvs.t(), out2.t(), nullptr,
                                   nullptr, b.reserve.data(), b.reserve_bytes, ws.data(), b.ws_bytes, nullptr));
  CHECK(out1.bits16() == out2.bits16());
  HostTensor dq1(FVA_DTYPE_BF16, q.shape()), dk1(FVA_DTYPE_BF16, k.shape()), dv1(FVA_DTYPE_BF16, v.shape());
  HostTensor dq2(FVA_DTYPE_BF16, q.shape()), dk2(FVA_DTYPE_BF16, k.shape()), dv2(FVA_DTYPE_BF16, v.shape());
  a.backward(dout, dq1, dk1, dv1, nullptr);
  b.backward(dout, dq2, dk2, dv2, nullptr);
  CHECK(dq1.bits16() == dq2.bits16());
  CHECK(dk1.bits16() == dk2.bits16());
  CHECK(dv1.bits16() == dv2.bits16());
  // kv block 1 is empty: never selected, and its dk/dv (padding slots, no mean) exactly zero.
  for (int32_t x : idx.values_i32()) CHECK(x != 1);
  const std::vector<double> dkv = dk1.values(), dvv = dv1.values();
  for (int64_t i = kBlock * D; i < 2 * kBlock * D; ++i) {
    CHECK(dkv[static_cast<size_t>(i)] == 0.0);
    CHECK(dvv[static_cast<size_t>(i)] == 0.0);
  }
}

// ---- fva_vsa_tile_plan ------------------------------------------------------------------------------

// FastVideo's tiling written out: tiles in (t, h, w) order, each tile's tokens in (t, h, w) order
// appended to its block's first slots.
void expected_plan(const int64_t dims[3], const int32_t tile[3], std::vector<int64_t>& slot,
                   std::vector<int32_t>& sizes) {
  const int64_t T = dims[0], H = dims[1], W = dims[2];
  const int64_t per_block = int64_t{tile[0]} * tile[1] * tile[2];
  slot.assign(static_cast<size_t>(T * H * W), -1);
  sizes.clear();
  for (int64_t t0 = 0; t0 < T; t0 += tile[0])
    for (int64_t h0 = 0; h0 < H; h0 += tile[1])
      for (int64_t w0 = 0; w0 < W; w0 += tile[2]) {
        const int64_t block = static_cast<int64_t>(sizes.size());
        int64_t n = 0;
        for (int64_t t = t0; t < std::min(T, t0 + tile[0]); ++t)
          for (int64_t h = h0; h < std::min(H, h0 + tile[1]); ++h)
            for (int64_t w = w0; w < std::min(W, w0 + tile[2]); ++w)
              slot[static_cast<size_t>((t * H + h) * W + w)] = block * per_block + n++;
        sizes.push_back(static_cast<int32_t>(n));
      }
}

TEST_CASE("fva_vsa_tile_plan equals FastVideo's tiling, also for grids not divisible by the tile") {
  struct Grid {
    int64_t dims[3];
    int32_t tile[3];
  };
  const std::vector<Grid> grids = {{{4, 4, 4}, {4, 4, 4}},   {{1, 1, 1}, {4, 4, 4}},  {{5, 7, 9}, {4, 4, 4}},
                                   {{8, 12, 16}, {4, 4, 4}}, {{3, 30, 13}, {4, 4, 4}}, {{21, 30, 52}, {4, 4, 4}},
                                   {{6, 5, 7}, {2, 3, 1}}};
  for (const Grid& g : grids) {
    INFO("grid " << g.dims[0] << "x" << g.dims[1] << "x" << g.dims[2] << " tile " << g.tile[0] << "x" << g.tile[1]
                 << "x" << g.tile[2]);
    const int64_t tokens = g.dims[0] * g.dims[1] * g.dims[2];
    const int64_t per_block = int64_t{g.tile[0]} * g.tile[1] * g.tile[2];
    int64_t nb = -1;
    REQUIRE_OK(fva_vsa_tile_plan(g.dims, g.tile, nullptr, nullptr, &nb));  // the count alone first
    int64_t want_nb = 1;
    for (int i = 0; i < 3; ++i) want_nb *= (g.dims[i] + g.tile[i] - 1) / g.tile[i];
    CHECK(nb == want_nb);
    std::vector<int64_t> slot(static_cast<size_t>(tokens), -7);
    std::vector<int32_t> sizes(static_cast<size_t>(nb), -7);
    int64_t nb2 = -1;
    REQUIRE_OK(fva_vsa_tile_plan(g.dims, g.tile, slot.data(), sizes.data(), &nb2));
    CHECK(nb2 == nb);
    std::vector<int64_t> want_slot;
    std::vector<int32_t> want_sizes;
    expected_plan(g.dims, g.tile, want_slot, want_sizes);
    CHECK(slot == want_slot);
    CHECK(sizes == want_sizes);
    // Properties: sizes sum to the token count; every token a distinct real slot of its block.
    int64_t sum = 0;
    for (int32_t s : sizes) sum += s;
    CHECK(sum == tokens);
    std::vector<char> used(static_cast<size_t>(nb * per_block), 0);
    int64_t bad = 0;
    for (int64_t s : slot) {
      if (s < 0 || s >= nb * per_block || used[static_cast<size_t>(s)] || s % per_block >= sizes[s / per_block]) {
        ++bad;
        continue;
      }
      used[static_cast<size_t>(s)] = 1;
    }
    CHECK(bad == 0);
    // Outputs are optional one by one.
    std::vector<int32_t> sizes_only(static_cast<size_t>(nb), -7);
    REQUIRE_OK(fva_vsa_tile_plan(g.dims, g.tile, nullptr, sizes_only.data(), nullptr));
    CHECK(sizes_only == want_sizes);
  }
}

}  // namespace
