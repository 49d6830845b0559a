// The CPU backend, through the public API, against tests/golden: outputs of FastVideo's own Triton
// kernels on an H200 (SPEC section 4: rel L2 <= 1e-2 for o, o_hp, dq, dk, dv; <= 1e-3 for lse; NaN
// never passes; block-mode fake quantization bit for bit). reference64 is checked against the same
// data, so the oracle of test_cpu_reference is itself tied to FastVideo.
//
// One property of the golden data limits what a spec-exact implementation can match directly
// (measured with reference64; see the comments at the checks). (Tile-mode scales used to be the
// other: FastVideo divides with the GPU's approximate div.full.f32 there, and the library and
// reference64 now divide the same way, nvfp4/fastvideo_division.h, so tile mode's fakes equal
// golden's bit for bit like block mode's.)
//   dV of the block-mode cases from the library's *own* forward lse: FQ_P of the normalized P puts
//      most groups near E4M3 underflow, where dV is very sensitive to lse; golden's lse itself differs
//      from the exact one by ~2e-3 (absolute, base 2), which moves dV by ~2%. With golden's lse the
//      backward matches to 1.7e-3. So dV from the library's own lse is checked against reference64 fed
//      that same lse, and its distance to golden is reported.
#include <doctest/doctest.h>
#include <fvattn/fvattn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "reference64.h"
#include "support/golden.h"
#include "support/api_fixtures.h"
#include "support/host_tensor.h"
#include "support/reference_bridge.h"

namespace {

using fvt::GoldenCase;
using fvt::HostTensor;

constexpr double kTol = 1e-2;
constexpr double kLseTol = 1e-3;
constexpr double kRefQatTol = 3.5e-3;  // SPEC section 4: a float64 implementation vs golden, QAT
constexpr double kRefVsaTol = 2.4e-3;  // ... and VSA
// dV from the library's own lse with quantized P in dV (see the header): bounded loosely, so that a
// grossly wrong result cannot hide behind the comparison with reference64 on that lse.
constexpr double kLseSensitiveBound = 4e-2;

// A bf16 HostTensor (contiguous BHSD) holding a ref64 tensor's values.
HostTensor bf16_tensor(const ref64::Tensor& t) {
  HostTensor h(FVA_DTYPE_BF16, {t.shape.B, t.shape.H, t.shape.S, t.shape.D});
  h.fill(t.data);
  return h;
}
HostTensor like(const ref64::Tensor& t) {
  return HostTensor(FVA_DTYPE_BF16, {t.shape.B, t.shape.H, t.shape.S, t.shape.D});
}
using fvt::to_ref;

double check_close(const std::string& what, const std::vector<double>& got, const std::vector<double>& ref,
                   double tol) {
  const int64_t nans = fvt::count_nan(got);
  CHECK_MESSAGE(nans == 0, what << ": " << nans << " NaN elements");
  const double e = fvt::rel_l2(got, ref);
  CHECK_MESSAGE(e <= tol, what << ": rel L2 " << e << " > " << tol);
  return e;
}

fva_qat_config_t fva_config(const ref64::QatConfig& r) {
  fva_qat_config_t c = FVA_QAT_CONFIG_INIT;
  c.softmax_scale = static_cast<float>(r.softmax_scale);
  c.causal = r.causal;
  c.quantize = r.quantize;
  c.smooth_k = r.smooth_k;
  c.qkv_scale = static_cast<int32_t>(r.qkv_scale);
  c.p_scale = static_cast<int32_t>(r.p_scale);
  c.quantize_p_backward = r.quantize_p_backward;
  c.high_precision_o = r.high_precision_o;
  c.quantized_qkv_backward = r.quantized_qkv_backward;
  return c;
}

struct QatOut {
  std::vector<double> o, o_hp, lse;
};

QatOut lib_forward(const fvt::CpuHandle& h, const fva_qat_config_t& cfg, const HostTensor& q, const HostTensor& k,
                   const HostTensor& v, HostTensor& o, HostTensor& o_hp, HostTensor& lse) {
  size_t bytes = 0;
  REQUIRE_OK(fva_qat_forward_workspace_size(h.h, &cfg, q.t(), k.t(), v.t(), &bytes));
  fvt::AlignedBuffer ws = fvt::workspace(bytes);
  o.poison();
  o_hp.poison();
  lse.poison();
  REQUIRE_OK(fva_qat_forward(h.h, &cfg, q.t(), k.t(), v.t(), o.t(), cfg.high_precision_o ? o_hp.t() : nullptr,
                             lse.t(), ws.data(), bytes, nullptr));
  return {o.values(), cfg.high_precision_o ? o_hp.values() : std::vector<double>{}, lse.values()};
}

ref64::Grads lib_backward(const fvt::CpuHandle& h, const fva_qat_config_t& cfg, const HostTensor& q, const HostTensor& k,
                          const HostTensor& v, const HostTensor& o_bwd, const HostTensor& lse,
                          const HostTensor& dout) {
  size_t bytes = 0;
  REQUIRE_OK(fva_qat_backward_workspace_size(h.h, &cfg, q.t(), k.t(), v.t(), &bytes));
  fvt::AlignedBuffer ws = fvt::workspace(bytes);
  HostTensor dq(FVA_DTYPE_BF16, q.shape()), dk(FVA_DTYPE_BF16, k.shape()), dv(FVA_DTYPE_BF16, v.shape());
  REQUIRE_OK(fva_qat_backward(h.h, &cfg, q.t(), k.t(), v.t(), o_bwd.t(), lse.t(), dout.t(), dq.t(), dk.t(),
                              dv.t(), ws.data(), bytes, nullptr));
  return {to_ref(dq), to_ref(dk), to_ref(dv)};
}

// Library fake quantization of x (as QAT applies it to q, k - mean, v) against golden's: bit for
// bit in block and tile mode.
void check_fake(const fvt::CpuHandle& h, const GoldenCase& gc, const std::string& name, const ref64::Tensor& x,
                ref64::Scale mode) {
  INFO(gc.name << " fake_" << name);
  HostTensor hx = bf16_tensor(x), hy = like(x);
  fva_nvfp4_config_t cfg = FVA_NVFP4_CONFIG_INIT;
  cfg.scale_mode = mode == ref64::Scale::Tile ? FVA_SCALE_TILE : FVA_SCALE_BLOCK;
  cfg.tile_tokens = static_cast<int32_t>(ref64::kQatTile);
  REQUIRE_OK(fva_nvfp4_fake_quantize(h.h, &cfg, hx.t(), hy.t(), nullptr));
  const std::vector<uint16_t> got = hy.bits16();
  const std::vector<uint16_t> gold = fvt::golden_bits(gc, "fake_" + name);
  REQUIRE(got.size() == gold.size());
  const size_t groups = got.size() / 16;
  size_t bad_groups = 0, bad_elems = 0;
  for (size_t g = 0; g < groups; ++g) {
    bool bad = false;
    for (size_t i = g * 16; i < g * 16 + 16; ++i) {
      if (got[i] == gold[i]) continue;
      bad = true;
      ++bad_elems;
    }
    bad_groups += bad;
  }
  CHECK_MESSAGE(bad_elems == 0, bad_elems << " of " << got.size() << " elements (" << bad_groups << " of "
                                          << groups << " groups) differ from golden (fakes must be bit-exact)");
}

TEST_CASE("golden QAT cases through the public API (CPU backend), and reference64 against them") {
  const std::vector<GoldenCase> cases = fvt::list_golden("qat");
  REQUIRE(cases.size() >= 5);
  fvt::CpuHandle h;
  for (const GoldenCase& gc : cases) {
    INFO("golden qat/" << gc.name);
    const ref64::QatConfig rcfg = fvt::golden_qat_config(gc);
    const fva_qat_config_t cfg = fva_config(rcfg);
    const ref64::Tensor q = fvt::golden_tensor(gc, "q"), k = fvt::golden_tensor(gc, "k"),
                        v = fvt::golden_tensor(gc, "v"), dout = fvt::golden_tensor(gc, "do");
    const ref64::Tensor g_o = fvt::golden_tensor(gc, "o"), g_obwd = fvt::golden_tensor(gc, "o_bwd");
    const std::vector<double> g_lse = fvt::golden_f32(gc, "lse");
    const ref64::Tensor g_dq = fvt::golden_tensor(gc, "dq"), g_dk = fvt::golden_tensor(gc, "dk"),
                        g_dv = fvt::golden_tensor(gc, "dv");

    // --- fake quantization (what attention multiplies) ---
    const ref64::QatInputs prep = ref64::qat_prepare(rcfg, ref64::DType::BF16, q, k, v);
    if (rcfg.quantize) {
      // The oracle's own quantizer is bit-exact with golden (signed zeros included).
      for (const char* n : {"q", "k", "v"}) {
        const ref64::Tensor& mine = n[0] == 'q' ? prep.fq : n[0] == 'k' ? prep.fk : prep.fv;
        const std::vector<uint16_t> gold = fvt::golden_bits(gc, std::string("fake_") + n);
        size_t diff = 0;
        for (size_t i = 0; i < gold.size(); ++i) diff += fvt::bf16_bits(mine.data[i]) != gold[i];
        CHECK_MESSAGE(diff == 0, "reference64 fake_" << n << ": " << diff << " elements differ from golden");
      }
    }
    if (rcfg.quantize) {
      check_fake(h, gc, "q", prep.q, rcfg.qkv_scale);
      check_fake(h, gc, "k", prep.kk, rcfg.qkv_scale);  // with smooth_k: of k minus its bf16 mean
      check_fake(h, gc, "v", prep.v, rcfg.qkv_scale);
    }

    // --- reference64 against golden (the oracle), fed golden's own fake_q/k/v ---
    ref64::QatInputs gin = prep;
    if (rcfg.quantize) {
      gin.fq = fvt::golden_tensor(gc, "fake_q");
      gin.fk = fvt::golden_tensor(gc, "fake_k");
      gin.fv = fvt::golden_tensor(gc, "fake_v");
    }
    {
      const ref64::QatForward rf = ref64::qat_forward(rcfg, ref64::DType::BF16, gin);
      check_close("reference64 o", rf.o.data, g_o.data, kRefQatTol);
      check_close("reference64 o_bwd", (rcfg.high_precision_o ? rf.o_hp : rf.o).data, g_obwd.data, kRefQatTol);
      check_close("reference64 lse", rf.lse, g_lse, kLseTol);
      const ref64::Grads rg = ref64::qat_backward(rcfg, ref64::DType::BF16, gin, g_obwd, g_lse, dout);
      check_close("reference64 dq", rg.dq.data, g_dq.data, kRefQatTol);
      check_close("reference64 dk", rg.dk.data, g_dk.data, kRefQatTol);
      check_close("reference64 dv", rg.dv.data, g_dv.data, kRefQatTol);
    }

    // --- the library's forward on golden's inputs ---
    const HostTensor hq = bf16_tensor(q), hk = bf16_tensor(k), hv = bf16_tensor(v), hdo = bf16_tensor(dout);
    HostTensor ho = like(q), hohp = like(q), hlse(FVA_DTYPE_F32, {q.shape.B, q.shape.H, q.shape.S});
    const QatOut lf = lib_forward(h, cfg, hq, hk, hv, ho, hohp, hlse);
    const std::vector<double>& lib_obwd = rcfg.high_precision_o ? lf.o_hp : lf.o;
    // The same function computed by reference64 with its own fakes.
    const ref64::QatForward rf = ref64::qat_forward(rcfg, ref64::DType::BF16, prep);
    check_close("library o vs reference64", lf.o, rf.o.data, kTol);
    if (rcfg.high_precision_o) check_close("library o_hp vs reference64", lf.o_hp, rf.o_hp.data, kTol);
    check_close("library lse vs reference64", lf.lse, rf.lse, kLseTol);
    check_close("library o vs golden", lf.o, g_o.data, kTol);
    check_close("library o_bwd vs golden", lib_obwd, g_obwd.data, kTol);
    check_close("library lse vs golden", lf.lse, g_lse, kLseTol);

    // --- backward A: golden's o_bwd and lse ---
    {
      const HostTensor hob = bf16_tensor(g_obwd);
      HostTensor hl(FVA_DTYPE_F32, {q.shape.B, q.shape.H, q.shape.S});
      hl.fill(g_lse);
      const ref64::Grads lg = lib_backward(h, cfg, hq, hk, hv, hob, hl, hdo);
      const ref64::Grads rg = ref64::qat_backward(rcfg, ref64::DType::BF16, prep, g_obwd, g_lse, dout);
      check_close("library dq vs reference64 (golden o_bwd, lse)", lg.dq.data, rg.dq.data, kTol);
      check_close("library dk vs reference64 (golden o_bwd, lse)", lg.dk.data, rg.dk.data, kTol);
      check_close("library dv vs reference64 (golden o_bwd, lse)", lg.dv.data, rg.dv.data, kTol);
      check_close("library dq vs golden (golden o_bwd, lse)", lg.dq.data, g_dq.data, kTol);
      check_close("library dk vs golden (golden o_bwd, lse)", lg.dk.data, g_dk.data, kTol);
      check_close("library dv vs golden (golden o_bwd, lse)", lg.dv.data, g_dv.data, kTol);
    }

    // --- backward B: the library's own o_for_bwd and lse ---
    {
      const HostTensor& hob = rcfg.high_precision_o ? hohp : ho;
      const ref64::Grads lg = lib_backward(h, cfg, hq, hk, hv, hob, hlse, hdo);
      const ref64::Grads rg =
          ref64::qat_backward(rcfg, ref64::DType::BF16, prep, to_ref(hob), lf.lse, dout);
      check_close("library dq vs reference64 (own o_bwd, lse)", lg.dq.data, rg.dq.data, kTol);
      check_close("library dk vs reference64 (own o_bwd, lse)", lg.dk.data, rg.dk.data, kTol);
      check_close("library dv vs reference64 (own o_bwd, lse)", lg.dv.data, rg.dv.data, kTol);
      const double eq = check_close("library dq vs golden (own o_bwd, lse)", lg.dq.data, g_dq.data, kTol);
      const double ek = check_close("library dk vs golden (own o_bwd, lse)", lg.dk.data, g_dk.data, kTol);
      // The header's dV note: with quantized P in dV, dV follows lse too closely for golden's lse noise.
      const bool dv_lse_sensitive = rcfg.quantize && rcfg.quantize_p_backward;
      const double ev = check_close("library dv vs golden (own o_bwd, lse)", lg.dv.data, g_dv.data,
                                    dv_lse_sensitive ? kLseSensitiveBound : kTol);
      if (dv_lse_sensitive)
        MESSAGE(gc.name << ": library backward vs golden (own o_bwd, lse): dq " << eq << ", dk " << ek
                        << ", dv " << ev);
    }
  }
}

TEST_CASE("golden VSA cases through the public API (CPU backend), and reference64 against them") {
  const std::vector<GoldenCase> cases = fvt::list_golden("vsa");
  REQUIRE(!cases.empty());
  fvt::CpuHandle h;
  for (const GoldenCase& gc : cases) {
    INFO("golden vsa/" << gc.name);
    const ref64::Tensor q = fvt::golden_tensor(gc, "q"), k = fvt::golden_tensor(gc, "k"),
                        v = fvt::golden_tensor(gc, "v"), dout = fvt::golden_tensor(gc, "do");
    const ref64::Tensor g_o = fvt::golden_tensor(gc, "o"), g_dq = fvt::golden_tensor(gc, "dq"),
                        g_dk = fvt::golden_tensor(gc, "dk"), g_dv = fvt::golden_tensor(gc, "dv");
    const std::vector<double> g_lse = fvt::golden_f32(gc, "lse");
    const std::vector<int64_t> ishape = fvt::golden_shape(gc, "q2k_idx");
    REQUIRE(ishape.size() == 4);
    ref64::VsaIndex idx;
    idx.B = ishape[0];
    idx.H = ishape[1];
    idx.num_q_blocks = ishape[2];
    idx.max_k = ishape[3];
    idx.q2k_idx = fvt::golden_i32(gc, "q2k_idx");
    idx.q2k_num = fvt::golden_i32(gc, "q2k_num");
    idx.block_sizes = fvt::golden_i32(gc, "vbs");
    const int64_t nkv = static_cast<int64_t>(idx.block_sizes.size());
    const ref64::VsaConfig rcfg;  // golden uses the default scale 1/sqrt(D)

    // reference64 against golden.
    const ref64::VsaForward rf = ref64::vsa_forward(rcfg, ref64::DType::BF16, q, k, v, idx);
    check_close("reference64 o", rf.o.data, g_o.data, kRefVsaTol);
    check_close("reference64 lse", rf.lse, g_lse, kLseTol);
    {
      const ref64::Grads rg = ref64::vsa_backward(rcfg, ref64::DType::BF16, q, k, v, g_o, g_lse, dout, idx);
      check_close("reference64 dq", rg.dq.data, g_dq.data, kRefVsaTol);
      check_close("reference64 dk", rg.dk.data, g_dk.data, kRefVsaTol);
      check_close("reference64 dv", rg.dv.data, g_dv.data, kRefVsaTol);
    }

    const HostTensor hq = bf16_tensor(q), hk = bf16_tensor(k), hv = bf16_tensor(v), hdo = bf16_tensor(dout);
    HostTensor hidx(FVA_DTYPE_I32, ishape), hnum(FVA_DTYPE_I32, {idx.B, idx.H, idx.num_q_blocks}),
        hbs(FVA_DTYPE_I32, {nkv});
    hidx.fill_i32(idx.q2k_idx);
    hnum.fill_i32(idx.q2k_num);
    hbs.fill_i32(idx.block_sizes);
    fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;

    // invert_indices: golden's k2q_num, and reference64's ascending lists.
    {
      HostTensor k2q_idx(FVA_DTYPE_I32, {idx.B, idx.H, nkv, idx.num_q_blocks}), k2q_num(FVA_DTYPE_I32, {idx.B, idx.H, nkv});
      size_t bytes = 0;
      REQUIRE_OK(fva_vsa_invert_indices_workspace_size(h.h, hidx.t(), k2q_idx.t(), &bytes));
      fvt::AlignedBuffer ws = fvt::workspace(bytes);
      REQUIRE_OK(fva_vsa_invert_indices(h.h, hidx.t(), hnum.t(), k2q_idx.t(), k2q_num.t(), ws.data(), bytes, nullptr));
      CHECK(k2q_num.values_i32() == fvt::golden_i32(gc, "k2q_num"));
      const ref64::K2Q inv = ref64::vsa_invert_indices(idx, nkv);
      CHECK(inv.num == fvt::golden_i32(gc, "k2q_num"));  // the oracle too
      CHECK(k2q_idx.values_i32() == inv.idx);
    }

    // Forward.
    HostTensor ho = like(q), hlse(FVA_DTYPE_F32, {q.shape.B, q.shape.H, q.shape.S});
    {
      size_t bytes = 0;
      REQUIRE_OK(fva_vsa_forward_workspace_size(h.h, &cfg, hq.t(), hk.t(), hv.t(), hidx.t(), &bytes));
      fvt::AlignedBuffer ws = fvt::workspace(bytes);
      REQUIRE_OK(fva_vsa_forward(h.h, &cfg, hq.t(), hk.t(), hv.t(), hidx.t(), hnum.t(), hbs.t(), ho.t(), hlse.t(),
                                 ws.data(), bytes, nullptr));
    }
    check_close("library o vs golden", ho.values(), g_o.data, kTol);
    check_close("library lse vs golden", hlse.values(), g_lse, kLseTol);
    check_close("library o vs reference64", ho.values(), rf.o.data, kTol);

    // Backward, from golden's o/lse and from the library's own.
    auto backward = [&](const HostTensor& o, const HostTensor& lse, const char* from) {
      INFO("backward from " << from << " o and lse");
      size_t bytes = 0;
      REQUIRE_OK(fva_vsa_backward_workspace_size(h.h, &cfg, hq.t(), hk.t(), hv.t(), hidx.t(), &bytes));
      fvt::AlignedBuffer ws = fvt::workspace(bytes);
      HostTensor dq = like(q), dk = like(k), dv = like(v);
      REQUIRE_OK(fva_vsa_backward(h.h, &cfg, hq.t(), hk.t(), hv.t(), o.t(), lse.t(), hdo.t(), hidx.t(), hnum.t(),
                                  hbs.t(), dq.t(), dk.t(), dv.t(), ws.data(), bytes, nullptr));
      check_close("library dq vs golden", dq.values(), g_dq.data, kTol);
      check_close("library dk vs golden", dk.values(), g_dk.data, kTol);
      check_close("library dv vs golden", dv.values(), g_dv.data, kTol);
      // kv block 0 is selected by nobody in this case (README): exactly zero dk and dv.
      const std::vector<double> dkv = dk.values(), dvv = dv.values();
      int64_t nonzero = 0;
      for (int64_t b = 0; b < k.shape.B; ++b)
        for (int64_t hh = 0; hh < k.shape.H; ++hh)
          for (int64_t s = 0; s < 64; ++s)
            for (int64_t d = 0; d < k.shape.D; ++d) {
              const size_t i = static_cast<size_t>(((b * k.shape.H + hh) * k.shape.S + s) * k.shape.D + d);
              nonzero += (dkv[i] != 0.0) + (dvv[i] != 0.0);
            }
      CHECK_MESSAGE(nonzero == 0, nonzero << " dk/dv elements of kv block 0 are not exactly zero");
    };
    HostTensor go = bf16_tensor(g_o), glse(FVA_DTYPE_F32, {q.shape.B, q.shape.H, q.shape.S});
    glse.fill(g_lse);
    backward(go, glse, "golden's");
    backward(ho, hlse, "the library's");
  }
}

}  // namespace
