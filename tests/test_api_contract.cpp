// The API contract (ARCHITECTURE.md): every bad input gets its status and a message naming the
// argument and the broken rule, and leaves every output untouched. Run on the CPU backend; the CUDA
// driver is disabled for this process so the no-device path is exercised on every machine.
#include <doctest/doctest.h>
#include <fvattn/fvattn.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tensor_desc.h"

namespace {

// Before main(): the driver is opened once per process, on the first fva_create.
const int g_cuda_disabled = setenv("FVATTN_DISABLE_CUDA", "1", 1);

constexpr uint8_t kPoison = 0xA5;

// A 64-byte aligned host allocation filled with the poison byte.
struct Block {
  std::shared_ptr<uint8_t> mem;
  size_t bytes = 0;
  explicit Block(size_t n) : bytes(n) {
    mem.reset(static_cast<uint8_t*>(std::aligned_alloc(64, (n + 63) / 64 * 64)), std::free);
    std::memset(mem.get(), kPoison, n);
  }
  uint8_t* get() const { return mem.get(); }
};

// A contiguous tensor over its own block.
struct T {
  Block block{1};
  fva_tensor_t d{};
  T() = default;
  T(int32_t dtype, const std::vector<int64_t>& shape)
      : block(fvadesc::contiguous_bytes(dtype, shape)), d(fvadesc::contiguous(block.get(), dtype, shape)) {}
  // Fill with a valid value pattern (inputs must be finite for the calls that succeed).
  void fill_inputs() {
    if (d.dtype == FVA_DTYPE_I32) return;
    if (d.dtype == FVA_DTYPE_F32) {
      auto* p = reinterpret_cast<float*>(block.get());
      for (size_t i = 0; i < block.bytes / 4; ++i) p[i] = 1.0f;
      return;
    }
    auto* p = reinterpret_cast<uint16_t*>(block.get());
    for (size_t i = 0; i < block.bytes / 2; ++i) p[i] = static_cast<uint16_t>(0x3c00 + (i % 7) * 64);
  }
};

struct Handle {
  fva_handle_t h = nullptr;
  Handle() {
    fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
    o.backend = FVA_BACKEND_CPU;
    REQUIRE(fva_create(&h, &o) == FVA_OK);
  }
  ~Handle() { fva_destroy(h); }
};

// Snapshot of output buffers, to prove a failed call wrote nothing.
struct Snapshot {
  std::vector<std::pair<const T*, std::vector<uint8_t>>> saved;
  void add(const T& t) {
    saved.emplace_back(&t, std::vector<uint8_t>(t.block.get(), t.block.get() + t.block.bytes));
  }
  bool unchanged() const {
    for (auto& [t, bytes] : saved)
      if (std::memcmp(t->block.get(), bytes.data(), bytes.size()) != 0) return false;
    return true;
  }
};

struct Expect {
  fva_status_t status;
  std::string message;  // a substring of fva_last_error()
};

void check_failure(fva_status_t got, const Expect& e, const Snapshot& outputs) {
  CHECK_MESSAGE(got == e.status, "status ", std::string(fva_status_string(got)), ", last error: ", std::string(fva_last_error()));
  const std::string msg = fva_last_error();
  CHECK_MESSAGE(msg.find(e.message) != std::string::npos, "message \"", msg,
                "\" lacks \"", e.message, "\"");
  CHECK_MESSAGE(outputs.unchanged(), "an output was written by a failing call");
}

// ---- QAT forward fixture --------------------------------------------------------------------------

struct QatFwd {
  static constexpr int64_t B = 1, Hq = 2, Hkv = 1, S = 32, D = 16;
  Handle handle;
  fva_qat_config_t cfg = FVA_QAT_CONFIG_INIT;
  T q{FVA_DTYPE_BF16, {B, Hq, S, D}}, k{FVA_DTYPE_BF16, {B, Hkv, S, D}}, v{FVA_DTYPE_BF16, {B, Hkv, S, D}};
  T o{FVA_DTYPE_BF16, {B, Hq, S, D}}, o_hp{FVA_DTYPE_BF16, {B, Hq, S, D}}, lse{FVA_DTYPE_F32, {B, Hq, S}};
  fva_tensor_t tq, tk, tv, to, to_hp, tlse;
  const fva_tensor_t* q_arg = &tq;
  const fva_tensor_t* o_hp_arg;
  fva_handle_t h;
  const fva_qat_config_t* cfg_arg = &cfg;
  size_t ws_bytes = 0;
  std::unique_ptr<Block> ws;
  void* ws_arg = nullptr;
  QatFwd() {
    q.fill_inputs(); k.fill_inputs(); v.fill_inputs();
    tq = q.d; tk = k.d; tv = v.d; to = o.d; to_hp = o_hp.d; tlse = lse.d;
    o_hp_arg = &to_hp;
    h = handle.h;
    REQUIRE(fva_qat_forward_workspace_size(h, &cfg, &tq, &tk, &tv, &ws_bytes) == FVA_OK);
    ws = std::make_unique<Block>(ws_bytes + 64);
    ws_arg = ws->get();
  }
  fva_status_t call() {
    return fva_qat_forward(h, cfg_arg, q_arg, &tk, &tv, &to, o_hp_arg, &tlse, ws_arg, ws_bytes, nullptr);
  }
  Snapshot outputs() const {
    Snapshot s;
    s.add(o); s.add(o_hp); s.add(lse);
    return s;
  }
};

struct Case {
  const char* name;
  std::function<void(QatFwd&)> mutate;
  Expect expect;
};

}  // namespace

TEST_CASE("QAT forward: a valid call succeeds and overwrites every output") {
  QatFwd f;
  REQUIRE(f.call() == FVA_OK);
  const auto* o = reinterpret_cast<const uint16_t*>(f.o.block.get());
  const auto* lse = reinterpret_cast<const float*>(f.lse.block.get());
  for (size_t i = 0; i < f.o.block.bytes / 2; ++i) REQUIRE(o[i] != 0xA5A5);
  for (size_t i = 0; i < f.lse.block.bytes / 4; ++i) REQUIRE(std::isfinite(lse[i]));
}

TEST_CASE("QAT forward: bad inputs return their status and message and write nothing") {
  const int64_t big = std::numeric_limits<int64_t>::max() / 2;
  const std::vector<Case> cases = {
      {"null handle", [](QatFwd& f) { f.h = nullptr; }, {FVA_ERR_INVALID_ARGUMENT, "h: is NULL"}},
      {"null q", [](QatFwd& f) { f.q_arg = nullptr; }, {FVA_ERR_INVALID_ARGUMENT, "q: is NULL"}},
      {"empty descriptor", [](QatFwd& f) { f.tq = fva_tensor_t{}; },
       {FVA_ERR_INVALID_ARGUMENT, "q: rank is 0 but must be 4 ([B, H, S, D])"}},
      {"null data", [](QatFwd& f) { f.tk.data = nullptr; }, {FVA_ERR_INVALID_ARGUMENT, "k: data is NULL"}},
      {"wrong dtype", [](QatFwd& f) { f.tq.dtype = FVA_DTYPE_F32; },
       {FVA_ERR_INVALID_ARGUMENT, "q: dtype is F32 (3) but must be BF16 or F16"}},
      {"unknown dtype", [](QatFwd& f) { f.tq.dtype = 99; },
       {FVA_ERR_INVALID_ARGUMENT, "q: dtype is unknown (99)"}},
      {"mixed dtypes", [](QatFwd& f) { f.tk.dtype = FVA_DTYPE_F16; },
       {FVA_ERR_INVALID_ARGUMENT, "k: dtype is F16 but q.dtype is BF16"}},
      {"wrong rank", [](QatFwd& f) { f.tv.rank = 3; }, {FVA_ERR_INVALID_ARGUMENT, "v: rank is 3 but must be 4"}},
      {"k and v lengths differ", [](QatFwd& f) { f.tv.shape[2] = 16; },
       {FVA_ERR_INVALID_ARGUMENT, "v: shape[2] is 16 but k.shape[2] is 32"}},
      {"head dims differ", [](QatFwd& f) { f.tk.shape[3] = 32; f.tv.shape[3] = 32; },
       {FVA_ERR_INVALID_ARGUMENT, "k: shape[3] is 32 but q.shape[3] is 16"}},
      {"batch differs", [](QatFwd& f) { f.tk.shape[0] = 2; f.tv.shape[0] = 2; },
       {FVA_ERR_INVALID_ARGUMENT, "k: shape[0] is 2 but q.shape[0] is 1"}},
      {"GQA heads do not divide", [](QatFwd& f) { f.tq.shape[1] = 3; f.tk.shape[1] = 2; f.tv.shape[1] = 2; },
       {FVA_ERR_INVALID_ARGUMENT, "k: shape[1] is 2 but must divide q.shape[1] = 3"}},
      {"zero extent", [](QatFwd& f) { f.tq.shape[2] = 0; },
       {FVA_ERR_INVALID_ARGUMENT, "q: shape[2] is 0 but must be >= 1"}},
      {"last stride not 1", [](QatFwd& f) { f.tq.strides[3] = 2; },
       {FVA_ERR_INVALID_ARGUMENT, "q: strides[3] is 2 but the last stride must be 1"}},
      {"negative stride", [](QatFwd& f) { f.tk.strides[2] = -16; },
       {FVA_ERR_INVALID_ARGUMENT, "k: strides[2] is -16 but strides must be >= 0"}},
      {"overflowing strides", [big](QatFwd& f) { f.tq.strides[1] = big; },
       {FVA_ERR_INVALID_ARGUMENT, "overflows 64-bit offsets"}},
      {"byte offsets overflow", [](QatFwd& f) { f.tq.strides[1] = int64_t{1} << 62; },
       {FVA_ERR_INVALID_ARGUMENT, "q: shape [1, 2, 32, 16] with strides [1024, 4611686018427387904, 16, 1] overflows 64-bit offsets"}},
      {"largest offset exactly INT64_MAX", [](QatFwd& f) { f.tq.strides[1] = std::numeric_limits<int64_t>::max() - 511; },
       {FVA_ERR_INVALID_ARGUMENT, "q: shape [1, 2, 32, 16] with strides [1024, 9223372036854775296, 16, 1] overflows 64-bit offsets"}},
      {"absurd broadcast input", [](QatFwd& f) { f.tk.shape[2] = f.tv.shape[2] = int64_t{1} << 60; f.tk.strides[2] = f.tv.strides[2] = 0; },
       {FVA_ERR_UNSUPPORTED, "k: shape [1, 1, 1152921504606846976, 16] has more than 2^56 elements"}},
      {"misaligned data", [](QatFwd& f) { f.tv.data = static_cast<char*>(f.tv.data) + 2; },
       {FVA_ERR_INVALID_ARGUMENT, "is not 16-byte aligned"}},
      {"row stride not 16-byte multiple", [](QatFwd& f) { f.tq.strides[2] = 17; },
       {FVA_ERR_INVALID_ARGUMENT, "q: strides[2] is 17 elements (34 bytes), not a multiple of 16 bytes"}},
      {"unsupported head dim", [](QatFwd& f) {
         for (auto* t : {&f.tq, &f.tk, &f.tv}) { t->shape[3] = 48; t->strides[2] = 48; t->strides[1] = 48 * 32; }
       },
       {FVA_ERR_UNSUPPORTED, "head dim shape[3] = 48 is not supported"}},
      {"o wrong dtype", [](QatFwd& f) { f.to.dtype = FVA_DTYPE_F16; },
       {FVA_ERR_INVALID_ARGUMENT, "o: dtype is F16 but q.dtype is BF16"}},
      {"o wrong shape", [](QatFwd& f) { f.to.shape[2] = 31; },
       {FVA_ERR_INVALID_ARGUMENT, "o: shape[2] is 31 but q.shape[2] is 32"}},
      {"lse wrong dtype", [](QatFwd& f) { f.tlse.dtype = FVA_DTYPE_BF16; },
       {FVA_ERR_INVALID_ARGUMENT, "lse: dtype is BF16 (1) but must be F32"}},
      {"lse wrong rank", [](QatFwd& f) { f.tlse.rank = 4; f.tlse.shape[3] = 1; f.tlse.strides[3] = 1; },
       {FVA_ERR_INVALID_ARGUMENT, "lse: rank is 4 but must be 3"}},
      {"lse wrong length", [](QatFwd& f) { f.tlse.shape[2] = 31; },
       {FVA_ERR_INVALID_ARGUMENT, "lse: shape[2] is 31 but q.shape[2] is 32"}},
      {"o_hp missing", [](QatFwd& f) { f.o_hp_arg = nullptr; },
       {FVA_ERR_INVALID_ARGUMENT, "o_hp: is NULL but cfg->high_precision_o is 1"}},
      {"o_hp unexpected", [](QatFwd& f) { f.cfg.high_precision_o = 0; },
       {FVA_ERR_INVALID_ARGUMENT, "o_hp: must be NULL when cfg->high_precision_o is 0"}},
      {"o aliases q", [](QatFwd& f) { f.to.data = f.tq.data; },
       {FVA_ERR_INVALID_ARGUMENT, "o: overlaps q"}},
      {"o_hp overlaps o", [](QatFwd& f) { f.to_hp.data = static_cast<char*>(f.to.data) + 32; },
       {FVA_ERR_INVALID_ARGUMENT, "o: overlaps o_hp"}},
      {"self-overlapping output", [](QatFwd& f) { f.to.strides[1] = 0; },
       {FVA_ERR_INVALID_ARGUMENT, "o: strides [1024, 0, 16, 1] with shape [1, 2, 32, 16] make different elements share memory"}},
      {"workspace too small", [](QatFwd& f) { f.ws_bytes -= 1; },
       {FVA_ERR_WORKSPACE_TOO_SMALL, "but this call needs"}},
      {"workspace null", [](QatFwd& f) { f.ws_arg = nullptr; },
       {FVA_ERR_INVALID_ARGUMENT, "ws: is NULL but this call needs"}},
      {"workspace misaligned", [](QatFwd& f) { f.ws_arg = f.ws->get() + 4; },
       {FVA_ERR_INVALID_ARGUMENT, "ws: "}},
      {"cfg struct_size too small", [](QatFwd& f) { f.cfg.struct_size = 8; },
       {FVA_ERR_INVALID_ARGUMENT, "cfg: struct_size is 8 but must be at least 40"}},
      {"cfg flag out of range", [](QatFwd& f) { f.cfg.causal = 2; },
       {FVA_ERR_INVALID_ARGUMENT, "cfg->causal is 2 but must be 0 or 1"}},
      {"cfg quantize out of range", [](QatFwd& f) { f.cfg.quantize = -1; },
       {FVA_ERR_INVALID_ARGUMENT, "cfg->quantize is -1 but must be 0 or 1"}},
      {"cfg qkv row scale", [](QatFwd& f) { f.cfg.qkv_scale = FVA_SCALE_ROW; },
       {FVA_ERR_INVALID_ARGUMENT, "cfg->qkv_scale is 2 but must be FVA_SCALE_BLOCK (0) or FVA_SCALE_TILE (1)"}},
      {"cfg p_scale out of range", [](QatFwd& f) { f.cfg.p_scale = 3; },
       {FVA_ERR_INVALID_ARGUMENT, "cfg->p_scale is 3"}},
      {"cfg negative scale", [](QatFwd& f) { f.cfg.softmax_scale = -1.0f; },
       {FVA_ERR_INVALID_ARGUMENT, "cfg->softmax_scale is -1 but must be finite and > 0, or 0"}},
      {"cfg NaN scale", [](QatFwd& f) { f.cfg.softmax_scale = std::nanf(""); },
       {FVA_ERR_INVALID_ARGUMENT, "cfg->softmax_scale is nan"}},
  };
  for (const Case& c : cases) {
    SUBCASE(c.name) {
      QatFwd f;
      c.mutate(f);
      const Snapshot before = f.outputs();
      check_failure(f.call(), c.expect, before);
    }
  }
}

TEST_CASE("workspace queries: checked like the call, *bytes untouched on failure") {
  QatFwd f;
  size_t bytes = 12345;
  f.tv.shape[2] = 7;
  CHECK(fva_qat_forward_workspace_size(f.h, &f.cfg, &f.tq, &f.tk, &f.tv, &bytes) == FVA_ERR_INVALID_ARGUMENT);
  CHECK(bytes == 12345);
  CHECK(std::string(fva_last_error()).find("v: shape[2] is 7") != std::string::npos);
  CHECK(fva_qat_backward_workspace_size(f.h, &f.cfg, &f.tq, &f.tk, &f.tv, nullptr) == FVA_ERR_INVALID_ARGUMENT);
  f.tv.shape[2] = 32;
  CHECK(fva_qat_backward_workspace_size(f.h, &f.cfg, &f.tq, &f.tk, &f.tv, nullptr) == FVA_ERR_INVALID_ARGUMENT);
  CHECK(std::string(fva_last_error()) == "bytes: is NULL");
  CHECK(fva_qat_forward_workspace_size(f.h, nullptr, &f.tq, &f.tk, &f.tv, &bytes) == FVA_OK);
  CHECK(bytes == f.ws_bytes);  // cfg NULL is the production preset, the fixture's config
}

// ---- QAT backward ---------------------------------------------------------------------------------

namespace {
struct QatBwd {
  static constexpr int64_t B = 1, Hq = 2, Hkv = 2, S = 32, D = 32;
  Handle handle;
  fva_qat_config_t cfg = FVA_QAT_CONFIG_INIT;
  T q{FVA_DTYPE_F16, {B, Hq, S, D}}, k{FVA_DTYPE_F16, {B, Hkv, S, D}}, v{FVA_DTYPE_F16, {B, Hkv, S, D}};
  T o{FVA_DTYPE_F16, {B, Hq, S, D}}, lse{FVA_DTYPE_F32, {B, Hq, S}}, dout{FVA_DTYPE_F16, {B, Hq, S, D}};
  T dq{FVA_DTYPE_F16, {B, Hq, S, D}}, dk{FVA_DTYPE_F16, {B, Hkv, S, D}}, dv{FVA_DTYPE_F16, {B, Hkv, S, D}};
  fva_tensor_t tq, tk, tv, to, tlse, tdout, tdq, tdk, tdv;
  size_t ws_bytes = 0;
  std::unique_ptr<Block> ws;
  QatBwd() {
    for (T* t : {&q, &k, &v, &o, &lse, &dout}) t->fill_inputs();
    tq = q.d; tk = k.d; tv = v.d; to = o.d; tlse = lse.d; tdout = dout.d; tdq = dq.d; tdk = dk.d; tdv = dv.d;
    REQUIRE(fva_qat_backward_workspace_size(handle.h, &cfg, &tq, &tk, &tv, &ws_bytes) == FVA_OK);
    ws = std::make_unique<Block>(ws_bytes + 64);
  }
  fva_status_t call() {
    return fva_qat_backward(handle.h, &cfg, &tq, &tk, &tv, &to, &tlse, &tdout, &tdq, &tdk, &tdv,
                            ws->get(), ws_bytes, nullptr);
  }
  Snapshot outputs() const {
    Snapshot s;
    s.add(dq); s.add(dk); s.add(dv);
    return s;
  }
};
}  // namespace

TEST_CASE("QAT backward: bad inputs") {
  struct BwdCase {
    const char* name;
    std::function<void(QatBwd&)> mutate;
    Expect expect;
  };
  const std::vector<BwdCase> cases = {
      {"valid call", [](QatBwd&) {}, {FVA_OK, ""}},
      {"dk wrong shape", [](QatBwd& f) { f.tdk.shape[2] = 16; },
       {FVA_ERR_INVALID_ARGUMENT, "dk: shape[2] is 16 but k.shape[2] is 32"}},
      {"dout wrong dtype", [](QatBwd& f) { f.tdout.dtype = FVA_DTYPE_BF16; },
       {FVA_ERR_INVALID_ARGUMENT, "dout: dtype is BF16 but q.dtype is F16"}},
      {"o_for_bwd wrong shape", [](QatBwd& f) { f.to.shape[1] = 1; },
       {FVA_ERR_INVALID_ARGUMENT, "o_for_bwd: shape[1] is 1 but q.shape[1] is 2"}},
      {"lse wrong batch", [](QatBwd& f) { f.tlse.shape[0] = 2; },
       {FVA_ERR_INVALID_ARGUMENT, "lse: shape[0] is 2 but q.shape[0] is 1"}},
      {"dq aliases dout", [](QatBwd& f) { f.tdq.data = f.tdout.data; },
       {FVA_ERR_INVALID_ARGUMENT, "dq: overlaps dout"}},
      {"dv aliases dk", [](QatBwd& f) { f.tdv.data = f.tdk.data; },
       {FVA_ERR_INVALID_ARGUMENT, "dk: overlaps dv"}},
      {"workspace too small", [](QatBwd& f) { f.ws_bytes /= 2; },
       {FVA_ERR_WORKSPACE_TOO_SMALL, "see fva_qat_backward_workspace_size"}},
  };
  for (const BwdCase& c : cases) {
    SUBCASE(c.name) {
      QatBwd f;
      c.mutate(f);
      const Snapshot before = f.outputs();
      if (c.expect.status == FVA_OK) {
        CHECK_MESSAGE(f.call() == FVA_OK, std::string(fva_last_error()));
        CHECK_FALSE(before.unchanged());
      } else {
        check_failure(f.call(), c.expect, before);
      }
    }
  }
}

TEST_CASE("packed outputs: dq, dk, dv interleaved in one [B, S, 3, H, D] buffer are accepted") {
  QatBwd f;
  // One buffer laid out [B, S, 3, H, D]; dq, dk, dv are its three slices (strides in BHSD order).
  const int64_t B = 1, S = 32, H = 2, D = 32;
  Block packed(static_cast<size_t>(B * S * 3 * H * D * 2));
  for (int j = 0; j < 3; ++j) {
    fva_tensor_t& t = j == 0 ? f.tdq : j == 1 ? f.tdk : f.tdv;
    t.data = packed.get() + static_cast<size_t>(j * H * D * 2);
    t.strides[0] = S * 3 * H * D;
    t.strides[1] = D;
    t.strides[2] = 3 * H * D;
    t.strides[3] = 1;
  }
  CHECK_MESSAGE(f.call() == FVA_OK, std::string(fva_last_error()));
  // Moving dk onto dq's slot of the packed buffer makes them share memory: now rejected.
  f.tdk.data = f.tdq.data;
  CHECK(f.call() == FVA_ERR_INVALID_ARGUMENT);
  CHECK(std::string(fva_last_error()).find("overlaps") != std::string::npos);
}

// ---- VSA ------------------------------------------------------------------------------------------

namespace {
struct Vsa {
  static constexpr int64_t B = 1, H = 2, NQ = 2, NKV = 3, MAXK = 2, D = 64;
  Handle handle;
  fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;
  T q{FVA_DTYPE_BF16, {B, H, NQ * 64, D}}, k{FVA_DTYPE_BF16, {B, H, NKV * 64, D}}, v{FVA_DTYPE_BF16, {B, H, NKV * 64, D}};
  T idx{FVA_DTYPE_I32, {B, H, NQ, MAXK}}, num{FVA_DTYPE_I32, {B, H, NQ}}, sizes{FVA_DTYPE_I32, {NKV}};
  T o{FVA_DTYPE_BF16, {B, H, NQ * 64, D}}, lse{FVA_DTYPE_F32, {B, H, NQ * 64}};
  T dout{FVA_DTYPE_BF16, {B, H, NQ * 64, D}};
  T dq{FVA_DTYPE_BF16, {B, H, NQ * 64, D}}, dk{FVA_DTYPE_BF16, {B, H, NKV * 64, D}}, dv{FVA_DTYPE_BF16, {B, H, NKV * 64, D}};
  T k2q_idx{FVA_DTYPE_I32, {B, H, NKV, NQ}}, k2q_num{FVA_DTYPE_I32, {B, H, NKV}};
  fva_tensor_t tq, tk, tv, tidx, tnum, tsizes, to, tlse, tdout, tdq, tdk, tdv, tk2q_idx, tk2q_num;
  Vsa() {
    for (T* t : {&q, &k, &v, &dout}) t->fill_inputs();
    auto* pi = reinterpret_cast<int32_t*>(idx.block.get());
    auto* pn = reinterpret_cast<int32_t*>(num.block.get());
    auto* ps = reinterpret_cast<int32_t*>(sizes.block.get());
    for (int i = 0; i < B * H * NQ; ++i) { pi[2 * i] = 0; pi[2 * i + 1] = 2; pn[i] = 2; }
    ps[0] = 64; ps[1] = 64; ps[2] = 17;
    tq = q.d; tk = k.d; tv = v.d; tidx = idx.d; tnum = num.d; tsizes = sizes.d; to = o.d; tlse = lse.d;
    tdout = dout.d; tdq = dq.d; tdk = dk.d; tdv = dv.d; tk2q_idx = k2q_idx.d; tk2q_num = k2q_num.d;
  }
  fva_status_t forward() {
    size_t bytes = 0;
    fva_status_t s = fva_vsa_forward_workspace_size(handle.h, &cfg, &tq, &tk, &tv, &tidx, &bytes);
    if (s != FVA_OK) return s;
    Block ws(bytes + 16);
    return fva_vsa_forward(handle.h, &cfg, &tq, &tk, &tv, &tidx, &tnum, &tsizes, &to, &tlse,
                           bytes ? ws.get() : nullptr, bytes, nullptr);
  }
  fva_status_t backward(size_t shrink = 0) {
    size_t bytes = 0;
    fva_status_t s = fva_vsa_backward_workspace_size(handle.h, &cfg, &tq, &tk, &tv, &tidx, &bytes);
    if (s != FVA_OK) return s;
    Block ws(bytes + 16);
    return fva_vsa_backward(handle.h, &cfg, &tq, &tk, &tv, &to, &tlse, &tdout, &tidx, &tnum, &tsizes,
                            &tdq, &tdk, &tdv, ws.get(), bytes - shrink, nullptr);
  }
  fva_status_t invert() {
    size_t bytes = 0;
    fva_status_t s = fva_vsa_invert_indices_workspace_size(handle.h, &tidx, &tk2q_idx, &bytes);
    if (s != FVA_OK) return s;
    Block ws(bytes + 16);
    return fva_vsa_invert_indices(handle.h, &tidx, &tnum, &tk2q_idx, &tk2q_num,
                                  bytes ? ws.get() : nullptr, bytes, nullptr);
  }
  Snapshot outputs() const {
    Snapshot s;
    for (const T* t : {&o, &lse, &dq, &dk, &dv, &k2q_idx, &k2q_num}) s.add(*t);
    return s;
  }
};

struct VsaCase {
  const char* name;
  std::function<void(Vsa&)> mutate;
  std::function<fva_status_t(Vsa&)> call;
  Expect expect;
};
}  // namespace

TEST_CASE("VSA: bad inputs") {
  auto fwd = [](Vsa& f) { return f.forward(); };
  auto bwd = [](Vsa& f) { return f.backward(); };
  auto inv = [](Vsa& f) { return f.invert(); };
  const std::vector<VsaCase> cases = {
      {"q length not a multiple of 64", [](Vsa& f) { f.tq.shape[2] = 100; f.tlse.shape[2] = 100; f.to.shape[2] = 100; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "q: shape[2] is 100 but VSA needs a multiple of 64"}},
      {"unsupported head dim", [](Vsa& f) { for (auto* t : {&f.tq, &f.tk, &f.tv}) t->shape[3] = 32; }, fwd,
       {FVA_ERR_UNSUPPORTED, "VSA needs D = 64 or 128"}},
      {"block size not 64", [](Vsa& f) { f.cfg.block_size = 32; }, fwd,
       {FVA_ERR_UNSUPPORTED, "cfg->block_size is 32 but only 64 is supported"}},
      {"block size zero", [](Vsa& f) { f.cfg.block_size = 0; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "cfg->block_size is 0 but must be positive"}},
      {"cfg struct_size", [](Vsa& f) { f.cfg.struct_size = 4; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "cfg: struct_size is 4 but must be at least 12"}},
      {"q2k_idx int64", [](Vsa& f) { f.tidx.dtype = FVA_DTYPE_I64; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "q2k_idx: dtype is I64 (5) but must be I32"}},
      {"q2k_idx wrong block count", [](Vsa& f) { f.tidx.shape[2] = 3; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "q2k_idx: shape[2] is 3 but must be 2 (num_q_blocks = q.shape[2] / 64)"}},
      {"q2k_num wrong shape", [](Vsa& f) { f.tnum.shape[1] = 1; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "q2k_num: shape[1] is 1 but q2k_idx.shape[1] is 2"}},
      {"block_sizes wrong length", [](Vsa& f) { f.tsizes.shape[0] = 2; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "block_sizes: shape[0] is 2 but must be 3 (num_kv_blocks = k.shape[2] / 64)"}},
      {"block_sizes rank", [](Vsa& f) { f.tsizes.rank = 2; f.tsizes.shape[1] = 1; f.tsizes.strides[1] = 1; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "block_sizes: rank is 2 but must be 1"}},
      {"lse overlaps o", [](Vsa& f) { f.tlse.data = f.to.data; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "o: overlaps lse"}},
      {"lse overlaps metadata", [](Vsa& f) { f.tlse.data = f.tnum.data; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "lse: overlaps "}},  // which neighbour it hits first depends on the heap
      {"dv wrong shape", [](Vsa& f) { f.tdv.shape[2] = 128; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "dv: shape[2] is 128 but v.shape[2] is 192"}},
      {"backward workspace too small", [](Vsa&) {}, [](Vsa& f) { return f.backward(1); },
       {FVA_ERR_WORKSPACE_TOO_SMALL, "see fva_vsa_backward_workspace_size"}},
      {"k2q_idx wrong width", [](Vsa& f) {
         f.tk2q_idx.shape[3] = 3;
         f.tk2q_idx.strides[2] = 3; f.tk2q_idx.strides[1] = 9; f.tk2q_idx.strides[0] = 18;
       }, inv,
       {FVA_ERR_INVALID_ARGUMENT, "k2q_idx: shape[3] is 3 but q2k_idx.shape[2] is 2"}},
      {"k2q_num wrong shape", [](Vsa& f) { f.tk2q_num.shape[2] = 2; }, inv,
       {FVA_ERR_INVALID_ARGUMENT, "k2q_num: shape[2] is 2 but k2q_idx.shape[2] is 3"}},
      {"k2q_num overlaps k2q_idx", [](Vsa& f) { f.tk2q_num.data = f.tk2q_idx.data; }, inv,
       {FVA_ERR_INVALID_ARGUMENT, "k2q_idx: overlaps k2q_num"}},
  };
  for (const VsaCase& c : cases) {
    SUBCASE(c.name) {
      Vsa f;
      c.mutate(f);
      const Snapshot before = f.outputs();
      check_failure(c.call(f), c.expect, before);
    }
  }
}

TEST_CASE("VSA: valid calls succeed; q2k_idx entries out of range are skipped, not read") {
  Vsa f;
  auto* pi = reinterpret_cast<int32_t*>(f.idx.block.get());
  pi[1] = 1000;  // out of range: skipped
  pi[3] = -5;
  CHECK_MESSAGE(f.forward() == FVA_OK, std::string(fva_last_error()));
  CHECK_MESSAGE(f.backward() == FVA_OK, std::string(fva_last_error()));
  CHECK_MESSAGE(f.invert() == FVA_OK, std::string(fva_last_error()));
  const auto* lse = reinterpret_cast<const float*>(f.lse.block.get());
  for (int i = 0; i < Vsa::B * Vsa::H * Vsa::NQ * 64; ++i) CHECK(std::isfinite(lse[i]));
}

// ---- the whole VSA layer --------------------------------------------------------------------------

namespace {
// A valid layer problem with GQA (2 q heads on 1 kv head) and a gate. The constructor sizes the
// buffers from a valid query and runs a valid forward, so the backward's reserve is a real one.
struct Layer {
  static constexpr int64_t B = 1, HQ = 2, HKV = 1, NQ = 2, NKV = 3, TOPK = 2, D = 64;
  Handle handle;
  fva_handle_t h;
  fva_vsa_layer_config_t cfg = FVA_VSA_LAYER_CONFIG_INIT;
  const fva_vsa_layer_config_t* cfg_arg = &cfg;
  T q{FVA_DTYPE_BF16, {B, HQ, NQ * 64, D}}, k{FVA_DTYPE_BF16, {B, HKV, NKV * 64, D}},
      v{FVA_DTYPE_BF16, {B, HKV, NKV * 64, D}}, gate{FVA_DTYPE_BF16, {B, HQ, NQ * 64, D}},
      dout{FVA_DTYPE_BF16, {B, HQ, NQ * 64, D}};
  T qs{FVA_DTYPE_I32, {NQ}}, kvs{FVA_DTYPE_I32, {NKV}};
  T out{FVA_DTYPE_BF16, {B, HQ, NQ * 64, D}}, idx{FVA_DTYPE_I32, {B, HQ, NQ, TOPK}}, num{FVA_DTYPE_I32, {B, HQ, NQ}};
  T dq{FVA_DTYPE_BF16, {B, HQ, NQ * 64, D}}, dk{FVA_DTYPE_BF16, {B, HKV, NKV * 64, D}},
      dv{FVA_DTYPE_BF16, {B, HKV, NKV * 64, D}}, dgate{FVA_DTYPE_BF16, {B, HQ, NQ * 64, D}};
  T reserve, ws;
  fva_tensor_t tq, tk, tv, tgate, tdout, tqs, tkvs, tout, tidx, tnum, tdq, tdk, tdv, tdgate;
  const fva_tensor_t *gate_arg = &tgate, *idx_arg = &tidx, *num_arg = &tnum, *dgate_arg = &tdgate;
  size_t ws_bytes = 0, reserve_bytes = 0;
  void *ws_arg = nullptr, *reserve_arg = nullptr;

  Layer() {
    h = handle.h;
    cfg.topk = TOPK;
    for (T* t : {&q, &k, &v, &gate, &dout}) t->fill_inputs();
    auto* ps = reinterpret_cast<int32_t*>(qs.block.get());
    ps[0] = 64, ps[1] = 30;
    auto* pk = reinterpret_cast<int32_t*>(kvs.block.get());
    pk[0] = 64, pk[1] = 0, pk[2] = 17;
    tq = q.d; tk = k.d; tv = v.d; tgate = gate.d; tdout = dout.d; tqs = qs.d; tkvs = kvs.d;
    tout = out.d; tidx = idx.d; tnum = num.d; tdq = dq.d; tdk = dk.d; tdv = dv.d; tdgate = dgate.d;
    REQUIRE(fva_vsa_layer_sizes(h, &cfg, &tq, &tk, &tv, &ws_bytes, &reserve_bytes) == FVA_OK);
    REQUIRE(reserve_bytes > 0);
    reserve = T(FVA_DTYPE_I32, {static_cast<int64_t>(reserve_bytes / 4 + 16)});
    ws = T(FVA_DTYPE_I32, {static_cast<int64_t>(ws_bytes / 4 + 16)});
    reserve_arg = reserve.block.get();
    ws_arg = ws.block.get();
    REQUIRE_MESSAGE(forward() == FVA_OK, std::string(fva_last_error()));
  }
  fva_status_t sizes(size_t* w, size_t* r) { return fva_vsa_layer_sizes(h, cfg_arg, &tq, &tk, &tv, w, r); }
  fva_status_t forward() {
    return fva_vsa_layer_forward(h, cfg_arg, &tq, &tk, &tv, gate_arg, &tqs, &tkvs, &tout, idx_arg, num_arg,
                                 reserve_arg, reserve_bytes, ws_arg, ws_bytes, nullptr);
  }
  fva_status_t backward() {
    return fva_vsa_layer_backward(h, cfg_arg, &tq, &tk, &tv, gate_arg, &tqs, &tkvs, &tdout, reserve_arg,
                                  reserve_bytes, &tdq, &tdk, &tdv, dgate_arg, ws_arg, ws_bytes, nullptr);
  }
  Snapshot outputs() const {
    Snapshot s;
    for (const T* t : {&out, &idx, &num, &dq, &dk, &dv, &dgate, &reserve}) s.add(*t);
    return s;
  }
};

struct LayerCase {
  const char* name;
  std::function<void(Layer&)> mutate;
  std::function<fva_status_t(Layer&)> call;
  Expect expect;
};

// q2k_idx's last extent set to `w`, its strides kept contiguous.
void set_width(fva_tensor_t& t, int64_t w) {
  t.shape[3] = w;
  t.strides[2] = w;
  t.strides[1] = t.shape[2] * w;
  t.strides[0] = t.shape[1] * t.strides[1];
}

// The q tensors (and the q block sizes) of a layer problem cut to `nq` blocks.
void cut_q_blocks(Layer& f, int64_t nq) {
  for (fva_tensor_t* t : {&f.tq, &f.tgate, &f.tdout, &f.tout, &f.tdq, &f.tdgate}) t->shape[2] = 64 * nq;
  f.tqs.shape[0] = nq;
  f.tidx.shape[2] = f.tnum.shape[2] = nq;
}
}  // namespace

TEST_CASE("VSA layer: valid calls succeed and overwrite every output") {
  Layer f;  // the forward ran in the constructor
  const auto* out = reinterpret_cast<const uint16_t*>(f.out.block.get());
  for (size_t i = 0; i < f.out.block.bytes / 2; ++i) REQUIRE(out[i] != 0xA5A5);
  // kv block 1 is empty: never selected; topk 2 of the two others.
  const auto* idx = reinterpret_cast<const int32_t*>(f.idx.block.get());
  const auto* num = reinterpret_cast<const int32_t*>(f.num.block.get());
  for (int i = 0; i < Layer::B * Layer::HQ * Layer::NQ; ++i) {
    CHECK(num[i] == 2);
    CHECK(idx[2 * i] == 0);
    CHECK(idx[2 * i + 1] == 2);
  }
  REQUIRE_MESSAGE(f.backward() == FVA_OK, std::string(fva_last_error()));
  for (const T* t : {&f.dq, &f.dk, &f.dv, &f.dgate}) {
    const auto* p = reinterpret_cast<const uint16_t*>(t->block.get());
    for (size_t i = 0; i < t->block.bytes / 2; ++i) REQUIRE(p[i] != 0xA5A5);
  }
  // Without a gate, and without the lists: a forward, then its backward.
  f.gate_arg = f.dgate_arg = nullptr;
  f.idx_arg = f.num_arg = nullptr;
  CHECK_MESSAGE(f.forward() == FVA_OK, std::string(fva_last_error()));
  CHECK_MESSAGE(f.backward() == FVA_OK, std::string(fva_last_error()));
}

TEST_CASE("VSA layer: bad inputs return their status and message and write nothing") {
  auto szs = [](Layer& f) {
    size_t w = 777, r = 888;
    const fva_status_t s = f.sizes(&w, &r);
    if (s != FVA_OK) CHECK((w == 777 && r == 888));  // a failed query writes neither size
    return s;
  };
  auto fwd = [](Layer& f) { return f.forward(); };
  auto bwd = [](Layer& f) { return f.backward(); };
  const std::vector<LayerCase> cases = {
      {"null handle", [](Layer& f) { f.h = nullptr; }, fwd, {FVA_ERR_INVALID_ARGUMENT, "h: is NULL"}},
      {"cfg NULL", [](Layer& f) { f.cfg_arg = nullptr; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "cfg: is NULL but the VSA layer needs a config"}},
      {"cfg NULL (sizes)", [](Layer& f) { f.cfg_arg = nullptr; }, szs,
       {FVA_ERR_INVALID_ARGUMENT, "cfg: is NULL"}},
      {"topk left at its initializer", [](Layer& f) { f.cfg.topk = 0; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "cfg->topk is 0 but must be >= 1 (FVA_VSA_LAYER_CONFIG_INIT leaves it 0: set cfg->topk"}},
      {"topk negative", [](Layer& f) { f.cfg.topk = -2; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "cfg->topk is -2 but must be >= 1"}},
      {"topk 0 (sizes)", [](Layer& f) { f.cfg.topk = 0; }, szs, {FVA_ERR_INVALID_ARGUMENT, "set cfg->topk"}},
      {"cfg struct_size", [](Layer& f) { f.cfg.struct_size = 4; }, szs,
       {FVA_ERR_INVALID_ARGUMENT, "cfg: struct_size is 4 but must be at least 16"}},
      {"block size 32", [](Layer& f) { f.cfg.block_size = 32; }, fwd,
       {FVA_ERR_UNSUPPORTED, "cfg->block_size is 32 but only 64 is supported"}},
      {"block size 0", [](Layer& f) { f.cfg.block_size = 0; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "cfg->block_size is 0 but must be positive"}},
      {"negative scale", [](Layer& f) { f.cfg.softmax_scale = -1.0f; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "cfg->softmax_scale is -1 but must be finite and > 0, or 0"}},
      {"workspace_bytes NULL", [](Layer&) {}, [](Layer& f) { size_t r = 5; const auto s = f.sizes(nullptr, &r); CHECK(r == 5); return s; },
       {FVA_ERR_INVALID_ARGUMENT, "workspace_bytes: is NULL"}},
      {"reserve_bytes NULL", [](Layer&) {}, [](Layer& f) { size_t w = 5; const auto s = f.sizes(&w, nullptr); CHECK(w == 5); return s; },
       {FVA_ERR_INVALID_ARGUMENT, "reserve_bytes: is NULL"}},
      {"q length not a multiple of 64", [](Layer& f) { for (auto* t : {&f.tq, &f.tgate, &f.tout}) t->shape[2] = 100; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "q: shape[2] is 100 but the VSA layer needs a multiple of 64"}},
      {"k length not a multiple of 64", [](Layer& f) { f.tk.shape[2] = f.tv.shape[2] = 150; }, szs,
       {FVA_ERR_INVALID_ARGUMENT, "k: shape[2] is 150 but the VSA layer needs a multiple of 64"}},
      {"k and v lengths differ", [](Layer& f) { f.tv.shape[2] = 128; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "v: shape[2] is 128 but k.shape[2] is 192"}},
      {"GQA heads do not divide", [](Layer& f) { f.tq.shape[1] = 3; f.tk.shape[1] = f.tv.shape[1] = 2; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "k: shape[1] is 2 but must divide q.shape[1] = 3"}},
      {"head dim 32", [](Layer& f) { for (auto* t : {&f.tq, &f.tk, &f.tv}) t->shape[3] = 32; }, fwd,
       {FVA_ERR_UNSUPPORTED, "the VSA layer needs D = 64 or 128"}},
      {"q float32", [](Layer& f) { f.tq.dtype = FVA_DTYPE_F32; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "q: dtype is F32 (3) but must be BF16 or F16"}},
      {"gate wrong dtype", [](Layer& f) { f.tgate.dtype = FVA_DTYPE_F16; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "gate: dtype is F16 but q.dtype is BF16"}},
      {"gate wrong shape", [](Layer& f) { f.tgate.shape[2] = 64; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "gate: shape[2] is 64 but q.shape[2] is 128"}},
      {"q_block_sizes wrong length", [](Layer& f) { f.tqs.shape[0] = 3; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "q_block_sizes: shape[0] is 3 but must be 2 (num_q_blocks = q.shape[2] / 64)"}},
      {"kv_block_sizes wrong length", [](Layer& f) { f.tkvs.shape[0] = 2; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "kv_block_sizes: shape[0] is 2 but must be 3 (num_kv_blocks = k.shape[2] / 64)"}},
      {"kv_block_sizes int64", [](Layer& f) { f.tkvs.dtype = FVA_DTYPE_I64; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "kv_block_sizes: dtype is I64 (5) but must be I32"}},
      {"q_block_sizes NULL", [](Layer& f) { f.tqs.data = nullptr; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "q_block_sizes: data is NULL"}},
      {"q2k_idx without q2k_num", [](Layer& f) { f.num_arg = nullptr; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "q2k_num: is NULL but q2k_idx is given"}},
      {"q2k_num without q2k_idx", [](Layer& f) { f.idx_arg = nullptr; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "q2k_idx: is NULL but q2k_num is given"}},
      {"q2k_idx wider than topk", [](Layer& f) { set_width(f.tidx, 3); }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "q2k_idx: shape[3] is 3 but must be 2 (min(cfg->topk, num_kv_blocks))"}},
      {"q2k_idx as wide as a topk above nkv", [](Layer& f) { f.cfg.topk = 10; set_width(f.tidx, 10); }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "q2k_idx: shape[3] is 10 but must be 3 (min(cfg->topk, num_kv_blocks))"}},
      {"q2k_num wrong shape", [](Layer& f) { f.tnum.shape[2] = 1; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "q2k_num: shape[2] is 1 but q2k_idx.shape[2] is 2"}},
      {"q2k_idx float", [](Layer& f) { f.tidx.dtype = FVA_DTYPE_F32; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "q2k_idx: dtype is F32 (3) but must be I32"}},
      {"out wrong dtype", [](Layer& f) { f.tout.dtype = FVA_DTYPE_F16; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "out: dtype is F16 but q.dtype is BF16"}},
      {"out aliases q", [](Layer& f) { f.tout.data = f.tq.data; }, fwd, {FVA_ERR_INVALID_ARGUMENT, "out: overlaps q"}},
      {"out in the reserve", [](Layer& f) { f.tout.data = f.reserve_arg; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "out: overlaps reserve"}},
      {"q2k_num in the reserve", [](Layer& f) { f.tnum.data = static_cast<char*>(f.reserve_arg) + 64; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "q2k_num: overlaps reserve"}},
      // The gate inside the reserve (which is larger than a gate), so that nothing else of the
      // call overlaps either, whatever the heap's layout.
      {"reserve over the gate", [](Layer& f) { f.tgate.data = static_cast<char*>(f.reserve_arg) + 64; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "reserve: overlaps gate"}},
      {"reserve NULL", [](Layer& f) { f.reserve_arg = nullptr; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "reserve: is NULL but the VSA layer needs"}},
      {"reserve NULL (backward)", [](Layer& f) { f.reserve_arg = nullptr; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "reserve: is NULL"}},
      {"reserve too small", [](Layer& f) { f.reserve_bytes -= 1; }, fwd,
       {FVA_ERR_WORKSPACE_TOO_SMALL, "bytes of reserve (see fva_vsa_layer_sizes)"}},
      {"reserve too small (backward)", [](Layer& f) { f.reserve_bytes /= 2; }, bwd,
       {FVA_ERR_WORKSPACE_TOO_SMALL, "reserve_bytes is"}},
      {"reserve misaligned", [](Layer& f) { f.reserve_arg = static_cast<char*>(f.reserve_arg) + 8; }, fwd,
       {FVA_ERR_INVALID_ARGUMENT, "is not 16-byte aligned"}},
      {"workspace too small", [](Layer& f) { f.ws_bytes -= 1; }, bwd,
       {FVA_ERR_WORKSPACE_TOO_SMALL, "(see fva_vsa_layer_sizes)"}},
      {"workspace NULL", [](Layer& f) { f.ws_arg = nullptr; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "ws: is NULL but this call needs"}},
      {"dgate without gate", [](Layer& f) { f.gate_arg = nullptr; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "dgate: is given but gate is NULL"}},
      {"gate without dgate", [](Layer& f) { f.dgate_arg = nullptr; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "dgate: is NULL but gate is given"}},
      {"dgate wrong shape", [](Layer& f) { f.tdgate.shape[1] = 1; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "dgate: shape[1] is 1 but q.shape[1] is 2"}},
      {"dq wrong shape", [](Layer& f) { f.tdq.shape[2] = 64; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "dq: shape[2] is 64 but q.shape[2] is 128"}},
      {"dk wrong dtype", [](Layer& f) { f.tdk.dtype = FVA_DTYPE_F16; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "dk: dtype is F16 but k.dtype is BF16"}},
      {"dv wrong heads", [](Layer& f) { f.tdv.shape[1] = 2; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "dv: shape[1] is 2 but v.shape[1] is 1"}},
      {"dout wrong dtype", [](Layer& f) { f.tdout.dtype = FVA_DTYPE_F16; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "dout: dtype is F16 but q.dtype is BF16"}},
      {"dgate aliases dq", [](Layer& f) { f.tdgate.data = f.tdq.data; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "dq: overlaps dgate"}},
      {"dq in the reserve", [](Layer& f) { f.tdq.data = f.reserve_arg; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "dq: overlaps reserve"}},
      // The reserve's record: the CPU backward refuses a reserve of another forward.
      {"reserve overwritten", [](Layer& f) { std::memset(f.reserve.block.get(), kPoison, 64); }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "reserve: holds no record of fva_vsa_layer_forward"}},
      {"reserve of another topk", [](Layer& f) { f.cfg.topk = 1; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "reserve: was written by a forward with topk (at most num_kv_blocks) = 2 but this call has topk (at most num_kv_blocks) = 1"}},
      {"reserve of another shape", [](Layer& f) { cut_q_blocks(f, 1); }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "reserve: was written by a forward with num_q_blocks = 2 but this call has num_q_blocks = 1"}},
      {"reserve of another scale", [](Layer& f) { f.cfg.softmax_scale = 0.5f; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "reserve: was written by a forward with softmax scale 0.125 but this call's is 0.5"}},
      {"reserve of another dtype", [](Layer& f) {
         for (auto* t : {&f.tq, &f.tk, &f.tv, &f.tgate, &f.tdout, &f.tdq, &f.tdk, &f.tdv, &f.tdgate}) t->dtype = FVA_DTYPE_F16;
       }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "reserve: was written by a forward with dtype = 1 but this call has dtype = 2"}},
      {"gate given to the forward, not the backward", [](Layer& f) { f.gate_arg = f.dgate_arg = nullptr; }, bwd,
       {FVA_ERR_INVALID_ARGUMENT, "reserve: was written by a forward with a gate but this call passes gate = NULL"}},
  };
  for (const LayerCase& c : cases) {
    SUBCASE(c.name) {
      Layer f;
      c.mutate(f);
      const Snapshot before = f.outputs();
      check_failure(c.call(f), c.expect, before);
    }
  }
}

TEST_CASE("VSA layer: a reserve written without a gate is refused by a backward given one") {
  Layer f;
  f.gate_arg = nullptr;
  REQUIRE_MESSAGE(f.forward() == FVA_OK, std::string(fva_last_error()));
  f.gate_arg = &f.tgate;
  const Snapshot before = f.outputs();
  check_failure(f.backward(), {FVA_ERR_INVALID_ARGUMENT, "reserve: was written by a forward without a gate but this call passes one"},
                before);
}

TEST_CASE("fva_vsa_tile_plan: bad inputs are refused and nothing is written") {
  struct PlanCase {
    const char* name;
    int64_t dims[3];
    int32_t tile[3];
    bool null_dims, null_tile;
    const char* message;
  };
  const std::vector<PlanCase> cases = {
      {"dims NULL", {5, 7, 9}, {4, 4, 4}, true, false, "dims: is NULL"},
      {"tile NULL", {5, 7, 9}, {4, 4, 4}, false, true, "tile: is NULL"},
      {"empty axis", {5, 0, 9}, {4, 4, 4}, false, false, "dims[1] (H) is 0 but must be >= 1"},
      {"negative axis", {-3, 7, 9}, {4, 4, 4}, false, false, "dims[0] (T) is -3 but must be >= 1"},
      {"zero tile", {5, 7, 9}, {4, 4, 0}, false, false, "tile[2] is 0 but must be >= 1"},
      {"negative tile", {5, 7, 9}, {-4, 4, 4}, false, false, "tile[0] is -4 but must be >= 1"},
      {"too many tokens", {int64_t{1} << 20, int64_t{1} << 20, int64_t{1} << 20}, {4, 4, 4}, false, false,
       "has more than 2^56 tokens"},
      {"tile too large for int32 sizes", {5, 7, 9}, {2048, 2048, 2048}, false, false, "has more than 2^31 - 1 tokens"},
  };
  for (const PlanCase& c : cases) {
    SUBCASE(c.name) {
      std::vector<int64_t> slot(5 * 7 * 9, -9);
      std::vector<int32_t> sizes(64, -9);
      int64_t nb = -9;
      const fva_status_t st = fva_vsa_tile_plan(c.null_dims ? nullptr : c.dims, c.null_tile ? nullptr : c.tile,
                                                slot.data(), sizes.data(), &nb);
      CHECK(st == FVA_ERR_INVALID_ARGUMENT);
      const std::string msg = fva_last_error();
      CHECK_MESSAGE(msg.find(c.message) != std::string::npos, "message \"" << msg << "\" lacks \"" << c.message << "\"");
      CHECK(nb == -9);
      CHECK(std::all_of(slot.begin(), slot.end(), [](int64_t x) { return x == -9; }));
      CHECK(std::all_of(sizes.begin(), sizes.end(), [](int32_t x) { return x == -9; }));
    }
  }
}

// ---- NVFP4 ----------------------------------------------------------------------------------------

TEST_CASE("NVFP4 fake quantization: checks, and in place is allowed") {
  Handle handle;
  T x{FVA_DTYPE_BF16, {1, 1, 32, 32}}, y{FVA_DTYPE_BF16, {1, 1, 32, 32}};
  x.fill_inputs();
  fva_nvfp4_config_t cfg = FVA_NVFP4_CONFIG_INIT;
  Snapshot ys;
  ys.add(y);
  fva_tensor_t tx = x.d, ty = y.d;

  SUBCASE("D not a multiple of 16") {
    tx.shape[3] = ty.shape[3] = 24;
    check_failure(fva_nvfp4_fake_quantize(handle.h, &cfg, &tx, &ty, nullptr),
                  {FVA_ERR_INVALID_ARGUMENT, "x: shape[3] is 24 but must be a multiple of 16"}, ys);
  }
  SUBCASE("row scale mode") {
    cfg.scale_mode = FVA_SCALE_ROW;
    check_failure(fva_nvfp4_fake_quantize(handle.h, &cfg, &tx, &ty, nullptr),
                  {FVA_ERR_INVALID_ARGUMENT, "cfg->scale_mode is 2"}, ys);
  }
  SUBCASE("tile of zero tokens") {
    cfg.scale_mode = FVA_SCALE_TILE;
    cfg.tile_tokens = 0;
    check_failure(fva_nvfp4_fake_quantize(handle.h, &cfg, &tx, &ty, nullptr),
                  {FVA_ERR_INVALID_ARGUMENT, "cfg->tile_tokens is 0 but must be >= 1"}, ys);
  }
  SUBCASE("partial overlap") {
    ty.data = static_cast<char*>(tx.data) + 64;
    ty.shape[2] = 16;
    tx.shape[2] = 16;
    Snapshot xs;
    xs.add(x);
    check_failure(fva_nvfp4_fake_quantize(handle.h, &cfg, &tx, &ty, nullptr),
                  {FVA_ERR_INVALID_ARGUMENT, "y: overlaps x"}, xs);
  }
  SUBCASE("in place equals out of place") {
    REQUIRE(fva_nvfp4_fake_quantize(handle.h, nullptr, &tx, &ty, nullptr) == FVA_OK);
    REQUIRE(fva_nvfp4_fake_quantize(handle.h, nullptr, &tx, &tx, nullptr) == FVA_OK);
    CHECK(std::memcmp(x.block.get(), y.block.get(), x.block.bytes) == 0);
  }
}

// ---- handles, statuses, errors ------------------------------------------------------------------

TEST_CASE("handles: options are checked; CUDA without a driver is FVA_ERR_NO_DEVICE; AUTO falls back") {
  (void)g_cuda_disabled;
  fva_handle_t h = reinterpret_cast<fva_handle_t>(0x1);
  CHECK(fva_create(nullptr, nullptr) == FVA_ERR_INVALID_ARGUMENT);
  CHECK(std::string(fva_last_error()) == "out: is NULL");

  fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
  o.struct_size = 4;
  CHECK(fva_create(&h, &o) == FVA_ERR_INVALID_ARGUMENT);
  CHECK(h == nullptr);
  CHECK(std::string(fva_last_error()).find("opts: struct_size is 4 but must be at least 16") == 0);

  o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = 7;
  CHECK(fva_create(&h, &o) == FVA_ERR_INVALID_ARGUMENT);
  CHECK(std::string(fva_last_error()).find("opts->backend is 7") == 0);
  o.backend = FVA_BACKEND_CPU;
  o.device = -2;
  CHECK(fva_create(&h, &o) == FVA_ERR_INVALID_ARGUMENT);
  o.device = -1;
  o.deterministic = 3;
  CHECK(fva_create(&h, &o) == FVA_ERR_INVALID_ARGUMENT);
  o.deterministic = 0;
  o.kernels = 2;
  CHECK(fva_create(&h, &o) == FVA_ERR_INVALID_ARGUMENT);
  CHECK(std::string(fva_last_error()).find("opts->kernels is 2") == 0);

  // A client built against the ABI-1 header passes the 16-byte struct without `kernels`: accepted,
  // and the bytes past its struct_size are not read (here: garbage that would fail the check).
  o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = FVA_BACKEND_CPU;
  o.struct_size = 16;
  o.kernels = 12345;
  REQUIRE(fva_create(&h, &o) == FVA_OK);
  CHECK(fva_destroy(h) == FVA_OK);

  o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = FVA_BACKEND_CUDA;
  CHECK(fva_create(&h, &o) == FVA_ERR_NO_DEVICE);
  CHECK(h == nullptr);
  CHECK(std::string(fva_last_error()).find("FVA_BACKEND_CUDA requested but no usable CUDA device") == 0);

  REQUIRE(fva_create(&h, nullptr) == FVA_OK);  // AUTO
  fva_handle_info_t info;
  info.struct_size = 8;
  CHECK(fva_get_info(h, &info) == FVA_ERR_INVALID_ARGUMENT);
  info.struct_size = sizeof info;
  REQUIRE(fva_get_info(h, &info) == FVA_OK);
  CHECK(info.backend == FVA_BACKEND_CPU);
  CHECK(info.device == -1);
  CHECK(std::string(info.image) == "cpu");
  CHECK(info.sm_count >= 1);
  CHECK(fva_get_info(nullptr, &info) == FVA_ERR_INVALID_ARGUMENT);
  CHECK(fva_get_info(h, nullptr) == FVA_ERR_INVALID_ARGUMENT);
  CHECK(fva_destroy(h) == FVA_OK);
  CHECK(fva_destroy(nullptr) == FVA_OK);
}

// fva_get_info of a handle created with `o` (FVA_OK required).
fva_handle_info_t info_of(const fva_handle_options_t& o) {
  fva_handle_t h = nullptr;
  REQUIRE_MESSAGE(fva_create(&h, &o) == FVA_OK, fva_last_error());
  fva_handle_info_t info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  REQUIRE(fva_get_info(h, &info) == FVA_OK);
  fva_destroy(h);
  return info;
}

// Sets an environment variable for a scope, restoring what was there (to test that an option's
// environment default is read once, by fva_create).
struct ScopedEnv {
  std::string name, old;
  bool had;
  ScopedEnv(const char* n, const char* value) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    setenv(n, value, 1);
  }
  ~ScopedEnv() {
    if (had) setenv(name.c_str(), old.c_str(), 1);
    else unsetenv(name.c_str());
  }
};

TEST_CASE("handles: tuning options are checked, resolved at create and reported by fva_get_info") {
  fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = FVA_BACKEND_CPU;
  CHECK(o.qat_forward_split == FVA_OPTION_AUTO);
  CHECK(o.qat_forward_clusters == FVA_OPTION_AUTO);
  CHECK(o.ds_budget_mib == FVA_OPTION_AUTO);
  CHECK(o.chained_launches == FVA_OPTION_AUTO);
  CHECK(o.cpu_threads == FVA_OPTION_AUTO);
  CHECK(o.ptx_jit == FVA_OPTION_AUTO);
  // Out of range: refused, naming the field.
  struct Bad {
    int32_t fva_handle_options_t::*field;
    int32_t value;
    const char* message;
  };
  const Bad bad[] = {
      {&fva_handle_options_t::qat_forward_split, 9, "opts->qat_forward_split is 9"},
      {&fva_handle_options_t::qat_forward_split, -2, "opts->qat_forward_split is -2"},
      {&fva_handle_options_t::qat_forward_clusters, 2, "opts->qat_forward_clusters is 2"},
      {&fva_handle_options_t::ds_budget_mib, -7, "opts->ds_budget_mib is -7"},
      {&fva_handle_options_t::chained_launches, 5, "opts->chained_launches is 5"},
      {&fva_handle_options_t::cpu_threads, 0, "opts->cpu_threads is 0"},
      {&fva_handle_options_t::cpu_threads, 5000, "opts->cpu_threads is 5000"},
      {&fva_handle_options_t::ptx_jit, 2, "opts->ptx_jit is 2"},
  };
  for (const Bad& b : bad) {
    INFO(b.message);
    fva_handle_options_t x = o;
    x.*b.field = b.value;
    fva_handle_t h = reinterpret_cast<fva_handle_t>(0x1);
    CHECK(fva_create(&h, &x) == FVA_ERR_INVALID_ARGUMENT);
    CHECK(h == nullptr);
    CHECK(std::string(fva_last_error()).find(b.message) == 0);
  }
  // Set: reported as set (a split of 1 is no split, reported 0).
  fva_handle_options_t set = o;
  set.qat_forward_split = 1;
  set.qat_forward_clusters = 0;
  set.ds_budget_mib = 12;
  set.chained_launches = 0;
  set.cpu_threads = 3;
  fva_handle_info_t info = info_of(set);
  CHECK(info.qat_forward_split == 0);
  CHECK(info.qat_forward_clusters == 0);
  CHECK(info.ds_budget_mib == 12);
  CHECK(info.chained_launches == 0);  // a CPU handle chains nothing
  CHECK(info.cpu_threads == 3);
  CHECK(info.sm_count == 3);
  CHECK(info.ptx_jit == 0);  // a CPU handle runs no image
  CHECK(std::string(info.image_reason).find("CPU") != std::string::npos);
  CHECK(info.deterministic == 0);
  CHECK(info.kernels == FVA_KERNELS_AUTO);
  set.qat_forward_split = 5;
  set.deterministic = 1;
  set.kernels = FVA_KERNELS_PORTABLE;
  info = info_of(set);
  CHECK(info.qat_forward_split == 5);
  CHECK(info.deterministic == 1);
  CHECK(info.kernels == FVA_KERNELS_PORTABLE);
  // A client built against a header that ends at `kernels` (20 bytes): every tuning option AUTO,
  // whatever lies past its struct_size.
  fva_handle_options_t old = o;
  old.struct_size = 20;
  old.cpu_threads = 0;  // would be refused if it were read
  old.ds_budget_mib = -9;
  {
    ScopedEnv t("FVATTN_NUM_THREADS", "");
    ScopedEnv b("FVATTN_DS_BUDGET_MIB", "");
    info = info_of(old);
  }
  CHECK(info.ds_budget_mib == 2048);
  CHECK(info.cpu_threads >= 1);
  // A caller's info struct of ABI 1 (296 bytes): filled up to there, struct_size says so, the
  // bytes past it untouched.
  fva_handle_t h = nullptr;
  REQUIRE(fva_create(&h, &o) == FVA_OK);
  std::vector<uint8_t> raw(sizeof(fva_handle_info_t) + 16, 0xEE);
  fva_handle_info_t* small = reinterpret_cast<fva_handle_info_t*>(raw.data());
  small->struct_size = offsetof(fva_handle_info_t, deterministic);
  REQUIRE(fva_get_info(h, small) == FVA_OK);
  CHECK(small->struct_size == offsetof(fva_handle_info_t, deterministic));
  CHECK(std::string(small->image) == "cpu");
  for (size_t i = offsetof(fva_handle_info_t, deterministic); i < raw.size(); ++i) CHECK(raw[i] == 0xEE);
  small->struct_size = offsetof(fva_handle_info_t, deterministic) - 4;
  CHECK(fva_get_info(h, small) == FVA_ERR_INVALID_ARGUMENT);
  fva_destroy(h);
}

TEST_CASE("handles: an environment variable supplies an AUTO option's default, read once at create") {
  fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = FVA_BACKEND_CPU;
  fva_handle_t kept = nullptr;
  {
    ScopedEnv split("FVATTN_QAT_SPLIT", "3");
    ScopedEnv clusters("FVATTN_QAT_CLUSTER", "0");
    ScopedEnv budget("FVATTN_DS_BUDGET_MIB", "64");
    ScopedEnv pdl("FVATTN_PDL", "0");
    ScopedEnv threads("FVATTN_NUM_THREADS", "2");
    fva_handle_info_t info = info_of(o);
    CHECK(info.qat_forward_split == 3);
    CHECK(info.qat_forward_clusters == 0);
    CHECK(info.ds_budget_mib == 64);
    CHECK(info.cpu_threads == 2);
    // A field that is set wins over its variable.
    fva_handle_options_t set = o;
    set.ds_budget_mib = 5;
    set.cpu_threads = 1;
    info = info_of(set);
    CHECK(info.ds_budget_mib == 5);
    CHECK(info.cpu_threads == 1);
    REQUIRE(fva_create(&kept, &o) == FVA_OK);
  }
  // The variables are gone, the handle keeps what create read.
  {
    ScopedEnv budget("FVATTN_DS_BUDGET_MIB", "auto");
    ScopedEnv threads("FVATTN_NUM_THREADS", "");
    fva_handle_info_t info;
    info.struct_size = sizeof info;
    REQUIRE(fva_get_info(kept, &info) == FVA_OK);
    CHECK(info.ds_budget_mib == 64);
    CHECK(info.cpu_threads == 2);
    CHECK(info_of(o).ds_budget_mib == 2048);
  }
  fva_destroy(kept);
  // A malformed variable: create refuses, naming it and the field; with the field set, the
  // variable is not read.
  const std::pair<const char*, const char*> malformed[] = {
      {"FVATTN_QAT_SPLIT", "many"}, {"FVATTN_QAT_SPLIT", "9"},   {"FVATTN_QAT_CLUSTER", "2"},
      {"FVATTN_DS_BUDGET_MIB", "1.5"}, {"FVATTN_DS_BUDGET_MIB", "-5"}, {"FVATTN_PDL", "yes"},
      {"FVATTN_NUM_THREADS", "0"}};
  for (const auto& [name, value] : malformed) {
    INFO(name << "=" << value);
    ScopedEnv env(name, value);
    fva_handle_t h = reinterpret_cast<fva_handle_t>(0x1);
    CHECK(fva_create(&h, &o) == FVA_ERR_INVALID_ARGUMENT);
    CHECK(h == nullptr);
    const std::string msg = fva_last_error();
    CHECK(msg.find(name) != std::string::npos);
    CHECK(msg.find(std::string("'") + value + "'") != std::string::npos);
  }
  ScopedEnv env("FVATTN_DS_BUDGET_MIB", "lots");
  fva_handle_options_t set = o;
  set.ds_budget_mib = 0;
  CHECK(info_of(set).ds_budget_mib == 0);
}

TEST_CASE("statuses and versions") {
  const char* names[] = {"FVA_OK", "FVA_ERR_INVALID_ARGUMENT", "FVA_ERR_UNSUPPORTED",
                         "FVA_ERR_WORKSPACE_TOO_SMALL", "FVA_ERR_NO_DEVICE", "FVA_ERR_CUDA",
                         "FVA_ERR_OUT_OF_MEMORY", "FVA_ERR_INTERNAL"};
  for (int s = 0; s < 8; ++s) CHECK(std::string(fva_status_string(s)) == names[s]);
  CHECK(std::string(fva_status_string(8)) == "unknown status");
  CHECK(std::string(fva_status_string(-1)) == "unknown status");
  CHECK(fva_version() == FVA_VERSION_MAJOR * 10000 + FVA_VERSION_MINOR * 100 + FVA_VERSION_PATCH);
  CHECK(fva_abi_version() == 1);
}

TEST_CASE("the last error is per thread and survives successful calls") {
  CHECK(fva_create(nullptr, nullptr) == FVA_ERR_INVALID_ARGUMENT);
  std::string other;
  std::thread t([&] { other = fva_last_error(); });
  t.join();
  CHECK(other.empty());
  CHECK(std::string(fva_last_error()) == "out: is NULL");
  CHECK(fva_abi_version() == 1);
  CHECK(std::string(fva_last_error()) == "out: is NULL");
}

TEST_CASE("ABI: struct layouts and constants are the published ones") {
  // These are the contract outside clients compile against (ARCHITECTURE.md); a change here is an ABI break.
  CHECK(sizeof(fva_tensor_t) == 8 + 4 + 4 + 6 * 8 + 6 * 8);
  CHECK(offsetof(fva_tensor_t, shape) == 16);
  CHECK(offsetof(fva_tensor_t, strides) == 64);
  // fva_handle_options_t grew by appending `kernels`, then the tuning options (struct_size
  // versioning): ABI-1 clients pass 16 bytes, which fva_create still accepts (see the handles test).
  CHECK(offsetof(fva_handle_options_t, kernels) == 16);
  CHECK(offsetof(fva_handle_options_t, qat_forward_split) == 20);
  CHECK(offsetof(fva_handle_options_t, qat_forward_clusters) == 24);
  CHECK(offsetof(fva_handle_options_t, ds_budget_mib) == 28);
  CHECK(offsetof(fva_handle_options_t, chained_launches) == 32);
  CHECK(offsetof(fva_handle_options_t, cpu_threads) == 36);
  CHECK(offsetof(fva_handle_options_t, ptx_jit) == 40);
  CHECK(sizeof(fva_handle_options_t) == 44);
  CHECK(FVA_OPTION_AUTO == -1);
  CHECK(FVA_KERNELS_AUTO == 0);
  CHECK(FVA_KERNELS_PORTABLE == 1);
  CHECK(sizeof(fva_qat_config_t) == 40);
  CHECK(offsetof(fva_qat_config_t, softmax_scale) == 4);
  CHECK(offsetof(fva_qat_config_t, quantized_qkv_backward) == 36);
  CHECK(sizeof(fva_vsa_config_t) == 12);
  CHECK(sizeof(fva_vsa_layer_config_t) == 16);
  CHECK(offsetof(fva_vsa_layer_config_t, topk) == 12);
  CHECK(sizeof(fva_nvfp4_config_t) == 12);
  // fva_handle_info_t: 296 bytes in ABI 1, then the resolved options appended.
  CHECK(offsetof(fva_handle_info_t, deterministic) == 4 * 6 + 16 + 256);
  CHECK(offsetof(fva_handle_info_t, cpu_threads) == 4 * 6 + 16 + 256 + 6 * 4);
  CHECK(offsetof(fva_handle_info_t, ptx_jit) == 4 * 6 + 16 + 256 + 7 * 4);
  CHECK(offsetof(fva_handle_info_t, image_reason) == 4 * 6 + 16 + 256 + 8 * 4);
  CHECK(sizeof(fva_handle_info_t) == 4 * 6 + 16 + 256 + 8 * 4 + 192);
  CHECK(FVA_DTYPE_BF16 == 1);
  CHECK(FVA_DTYPE_I64 == 5);
  CHECK(FVA_ERR_INTERNAL == 7);
  const fva_qat_config_t c = FVA_QAT_CONFIG_INIT;
  CHECK(c.quantize == 1);
  CHECK(c.causal == 0);
  CHECK(c.smooth_k == 0);
  CHECK(c.qkv_scale == FVA_SCALE_BLOCK);
  CHECK(c.p_scale == FVA_SCALE_BLOCK);
  CHECK(c.quantize_p_backward == 1);
  CHECK(c.high_precision_o == 1);
  CHECK(c.quantized_qkv_backward == 1);
}
