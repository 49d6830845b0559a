// libFuzzer target over every entry point of the public API: it builds descriptors and
// configs from the input (a valid small problem, then up to eight mutations: ranks, dtypes, shapes
// and strides near the 64-bit limits, NULL and odd pointers, aliasing, config fields, workspace
// pointers and sizes), runs the call on the CPU backend over real, exactly sized buffers
// (memory_model.h says which pointers it may pass), and checks the contract of fvattn.h:
//   - no crash, no sanitizer report, no hang (work per call is bounded, see kWorkBudget);
//   - the status is a known one, and a failure leaves a message in fva_last_error();
//   - a failing call writes nothing at all; a workspace query touches no tensor memory and leaves
//     *bytes alone when it fails; a successful call writes no arena that holds only inputs;
//   - a call whose workspace query fails (same handle, config and shared tensors) fails too.
// Any violation aborts, which libFuzzer reports as a crash with the input that caused it.
#include <fmt/format.h>
#include <fvattn/fvattn.h>

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "byte_reader.h"
#include "memory_model.h"
#include "tensor_desc.h"

namespace fvafuzz {
namespace {

[[noreturn]] void finding(const std::string& what) {
  fmt::print(stderr, "\nfvattn_fuzz: contract violated: {}\n", what);
  std::abort();
}

// Upper bound on the multiply-adds one call may do: a few milliseconds under ASan. A problem above
// it is still checked, but its last tensor argument is passed as NULL so that the call must fail
// (a NULL tensor is always rejected) after checking everything before it.
constexpr double kWorkBudget = 4.0e6;

fva_handle_t g_cpu = nullptr;

// Per operation: calls, and how many ended in each status. FVA_FUZZ_STATS=1 prints them at exit,
// to see that inputs reach the kernels (FVA_OK) and each kind of rejection.
// Keyed by the name's address (not its text: string comparisons would feed the fuzzer's dictionary).
struct OpStats {
  const char* op;
  bool query;
  long calls = 0;
  long by_status[FVA_ERR_INTERNAL + 1] = {};
};
std::vector<OpStats> g_stats;

void count(const char* op, bool query, fva_status_t st) {
  OpStats* s = nullptr;
  for (OpStats& x : g_stats)
    if (x.op == op && x.query == query) s = &x;
  if (!s) s = &g_stats.emplace_back(OpStats{op, query});
  ++s->calls;
  if (st >= FVA_OK && st <= FVA_ERR_INTERNAL) ++s->by_status[st];
}

void print_stats() {
  fmt::print(stderr, "{:<38} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n", "fvattn_fuzz: calls", "total", "OK",
             "INVALID", "UNSUPP", "WS_SMALL", "NO_DEV");
  for (const OpStats& s : g_stats)
    fmt::print(stderr, "{:<38} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
               fmt::format("{}{}", s.op, s.query ? "_workspace_size" : ""), s.calls, s.by_status[0],
               s.by_status[1], s.by_status[2], s.by_status[3], s.by_status[4]);
}

void check_status(fva_status_t st, const char* op, bool query = false) {
  count(op, query, st);
  if (st < FVA_OK || st > FVA_ERR_INTERNAL)
    finding(fmt::format("{} returned status {}, not one of the header's", op, st));
  if (st == FVA_ERR_INTERNAL) finding(fmt::format("{}: FVA_ERR_INTERNAL: {}", op, fva_last_error()));
  if (st != FVA_OK && std::strlen(fva_last_error()) == 0)
    finding(fmt::format("{} failed with {} but fva_last_error() is empty", op, fva_status_string(st)));
}

// ---- values -----------------------------------------------------------------------------------

int64_t interesting64(ByteReader& in) {
  return in.pick<int64_t>({0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 63, 64, 65, 127, 128, 256, 4096,
                           (int64_t{1} << 31) - 1, int64_t{1} << 31, int64_t{1} << 32,
                           int64_t{1} << 55, int64_t{1} << 56, (int64_t{1} << 56) + 1,
                           int64_t{1} << 62, std::numeric_limits<int64_t>::max() - 1,
                           std::numeric_limits<int64_t>::max(), -1, -2, -16,
                           std::numeric_limits<int64_t>::min()});
}

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

uint32_t interesting32(ByteReader& in) {
  const float inf = std::numeric_limits<float>::infinity();
  return in.pick<uint32_t>({0u, 1u, 2u, 3u, 0xffffffffu, 0x80000000u, 0x7fffffffu, 4u, 8u, 11u, 12u,
                            16u, 17u, 31u, 32u, 39u, 40u, 41u, 63u, 64u, 65u, 1000u,
                            float_bits(1.0f), float_bits(-1.0f), float_bits(0.125f),
                            float_bits(-0.0f), float_bits(inf), float_bits(-inf),
                            float_bits(std::nanf("")), float_bits(3.0e38f), float_bits(1e-40f)});
}

// ---- problems -----------------------------------------------------------------------------------

enum class Fill { kAttnIn, kOutput, kLseIn, kIndex, kCount, kBlockSizes };

struct Dims {
  int32_t dtype = FVA_DTYPE_BF16;
  bool bshd = false;
  int64_t pad = 0;
  int64_t B = 1, Hq = 1, Hkv = 1, Sq = 1, Skv = 1, D = 16;
  int64_t num_kv_blocks = 1, max_k = 1;  // VSA and index inversion
};

Dims read_layout(ByteReader& in) {
  Dims d;
  const uint8_t c = in.u8();
  d.dtype = (c & 1) ? FVA_DTYPE_F16 : FVA_DTYPE_BF16;
  d.bshd = (c & 2) != 0;
  d.pad = (c & 4) ? 8 : 0;
  d.B = 1 + in.u8() % 2;
  d.Hkv = 1 + in.u8() % 2;
  d.Hq = d.Hkv * (1 + in.u8() % 3);
  return d;
}

// [B, H, S, D] in the chosen layout, every row followed by `pad` unused elements.
fva_tensor_t attn(const Dims& d, int64_t H, int64_t S) {
  fva_tensor_t t{};
  t.dtype = d.dtype;
  t.rank = 4;
  t.shape[0] = d.B, t.shape[1] = H, t.shape[2] = S, t.shape[3] = d.D;
  const int64_t row = d.D + d.pad;
  t.strides[3] = 1;
  if (d.bshd) {
    t.strides[1] = row, t.strides[2] = H * row, t.strides[0] = S * H * row;
  } else {
    t.strides[2] = row, t.strides[1] = S * row, t.strides[0] = H * S * row;
  }
  return t;
}

// A contiguous tensor; its data pointer is set by Arenas::place.
fva_tensor_t contiguous(int32_t dtype, const std::vector<int64_t>& shape) {
  return fvadesc::contiguous(nullptr, dtype, shape);
}

// One call being built: its tensor arguments (with how to fill each), its config as raw bytes
// (every config field is 4 bytes wide, struct_size first), and the handle and workspace choices.
struct Call {
  std::vector<Arg> args;
  std::vector<Fill> fills;
  std::vector<uint8_t> cfg;  // empty: the operation takes no config
  bool cfg_null = false;
  bool handle_null = false;
  int ws_ptr = 0;            // 0 the queried buffer, 1 NULL, 2 misaligned by 8 bytes
  int ws_size = 0;           // 0 the queried size, 1 one byte less, 2 zero, 3 SIZE_MAX, 4 more,
                             // 5 half
  size_t budget_null = 0;    // the argument passed as NULL when the work is over budget
  int reserve_arg = -1;      // the VSA layer's reserve: an I32 [bytes / 4] argument passed as void*
  int reserve_size = 0;      // its reserve_bytes: 0 all its arena holds from its pointer, 1 one byte
                             // less, 2 half, 3 zero (never more: the caller's word is the bound)
  Dims dims;

  void add(const char* name, const fva_tensor_t& t, Fill fill) {
    Arg a;
    a.name = name;
    a.is_output = fill == Fill::kOutput;
    a.desc = t;
    a.arena = static_cast<int>(args.size());
    args.push_back(a);
    fills.push_back(fill);
  }
  template <typename Config>
  void set_config(const Config& c) {
    cfg.resize(sizeof c);
    std::memcpy(cfg.data(), &c, sizeof c);
  }
};

// a + b modulo 2^64 (a may already be an extreme value).
int64_t wrapping_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

void mutate_tensor(Call& c, Arg& a, ByteReader& in) {
  const int d = in.u8() % FVA_MAX_RANK;
  switch (in.u8() % 13) {
    case 0: a.desc.rank = static_cast<int32_t>(interesting32(in)); break;
    case 1: a.desc.dtype = in.pick<int32_t>({0, 1, 2, 3, 4, 5, 6, 31, 32, -1, INT32_MIN}); break;
    case 2: a.desc.shape[d] = interesting64(in); break;
    case 3: a.desc.strides[d] = interesting64(in); break;
    case 4: a.desc.shape[d] = wrapping_add(a.desc.shape[d], in.pick<int64_t>({-1, 1, -2, 2, 64, -64})); break;
    case 5: a.desc.strides[d] = wrapping_add(a.desc.strides[d], in.pick<int64_t>({8, -8, 1, -1, 16, 64})); break;
    case 6: a.ptr = PtrKind::kNull; break;
    case 7: a.ptr = PtrKind::kOdd, a.odd = 1 + in.u8() % 15; break;
    case 8: a.ptr = PtrKind::kTop, a.top_gap = 16 * (1 + uint64_t{in.u8()}); break;
    case 9: {  // share another argument's memory, at its offset or a little after
      const Arg& b = c.args[in.u8() % c.args.size()];
      a.arena = b.arena;
      a.offset = b.offset + 16 * static_cast<uint64_t>(in.u8() % 4);
      break;
    }
    case 10: a.pass_null = true; break;
    case 11: {  // take another argument's geometry (agreeing, or not, with the rest)
      const Arg& b = c.args[in.u8() % c.args.size()];
      a.desc.rank = b.desc.rank;
      std::memcpy(a.desc.shape, b.desc.shape, sizeof a.desc.shape);
      std::memcpy(a.desc.strides, b.desc.strides, sizeof a.desc.strides);
      break;
    }
    case 12: {  // swap two dimensions' strides (a permuted layout, or an overlapping one)
      const int e = in.u8() % FVA_MAX_RANK;
      std::swap(a.desc.strides[d], a.desc.strides[e]);
      break;
    }
  }
}

void mutate(Call& c, ByteReader& in) {
  const int n = in.u8() % 9;
  for (int m = 0; m < n; ++m) {
    const size_t target = in.u8() % (c.args.size() + 3);
    if (target < c.args.size()) {
      mutate_tensor(c, c.args[target], in);
    } else if (target == c.args.size()) {  // the config
      if (c.cfg.empty()) continue;
      const uint8_t kind = in.u8() % 3;
      if (kind == 0) {
        c.cfg_null = true;
      } else {  // field 0 is struct_size
        const size_t field = kind == 1 ? 0 : in.u8() % (c.cfg.size() / 4);
        const uint32_t v = interesting32(in);
        std::memcpy(c.cfg.data() + 4 * field, &v, 4);
      }
    } else if (target == c.args.size() + 1) {
      const uint8_t kind = in.u8() % 7;
      if (kind < 2) c.ws_ptr = 1 + kind;
      else c.ws_size = kind - 1;
    } else {
      c.handle_null = true;
    }
  }
}

// ---- filling the arenas -------------------------------------------------------------------------

struct Rng {  // xorshift64*: deterministic per input
  uint64_t s;
  uint64_t next() {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
};

// bf16/f16 bits: mostly moderate values of either sign, at `special_rate`/256 an inf, NaN, zero,
// subnormal or the largest finite value (of either format: the bits mean different things in each).
uint16_t half_bits(int32_t dtype, Rng& r, int special_rate) {
  static const uint16_t kSpecials[] = {0x7f80, 0xff80, 0x7fc0, 0xffff, 0x0000,
                                       0x8000, 0x7bff, 0x0001, 0x7f7f, 0x7c00};
  const uint64_t x = r.next();
  if (static_cast<int>(x % 256) < special_rate) return kSpecials[(x >> 8) % 10];
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  if (dtype == FVA_DTYPE_F16)  // |x| in [2^-3, 2^2)
    return static_cast<uint16_t>(sign | ((12 + (x >> 20) % 5) << 10) | ((x >> 24) & 0x3ff));
  return static_cast<uint16_t>(sign | ((124 + (x >> 20) % 5) << 7) | ((x >> 24) & 0x7f));
}

float lse_value(Rng& r, int special_rate) {
  const uint64_t x = r.next();
  if (static_cast<int>(x % 256) < special_rate) {
    const float inf = std::numeric_limits<float>::infinity();
    const float specials[] = {-inf, inf, std::nanf(""), 0.0f, -0.0f, 3.0e38f};
    return specials[(x >> 8) % 6];
  }
  return static_cast<float>((x >> 11) % 16000) / 1000.0f - 4.0f;
}

// Index metadata from the input's last bytes: mostly in range, sometimes not (SPEC section 3 and
// the header: out-of-range entries are skipped, counts clamped to [0, max_k], sizes to [0, 64]).
int32_t index_value(Fill f, const Dims& d, int64_t i, uint8_t v) {
  const int64_t nkv = std::max<int64_t>(d.num_kv_blocks, 1), max_k = std::max<int64_t>(d.max_k, 1);
  if (v < 200) {
    switch (f) {
      case Fill::kIndex: return static_cast<int32_t>((v + i % max_k) % nkv);  // zeros: 0, 1, 2, ...
      case Fill::kCount: return static_cast<int32_t>(max_k - v % (max_k + 1));  // zeros: full lists
      default: return static_cast<int32_t>(64 - v % 65);                        // zeros: full blocks
    }
  }
  const int32_t wild[] = {-1, static_cast<int32_t>(nkv), static_cast<int32_t>(max_k + 1), 65, INT32_MAX,
                          INT32_MIN, -64, 1 << 20};
  return wild[v % 8];
}

void fill_arenas(const Call& c, const Arenas& arenas, ByteReader& in) {
  Rng rng{0x9E3779B97F4A7C15ull ^ in.u32()};
  const int special_rate = in.u8() % 32;  // out of 256 values: NaN, inf, extremes
  std::vector<int> owner(arenas.count(), -1);
  for (size_t i = 0; i < c.args.size(); ++i) {
    const size_t j = static_cast<size_t>(c.args[i].arena);
    if (owner[j] < 0 && c.args[i].ptr == PtrKind::kArena) owner[j] = static_cast<int>(i);
  }
  for (size_t j = 0; j < arenas.count(); ++j) {
    uint8_t* p = arenas.data(j);
    const size_t n = arenas.size(j);
    if (!p || n == 0) continue;
    std::memset(p, 0xA5, n);
    if (owner[j] < 0) continue;
    const Fill f = c.fills[static_cast<size_t>(owner[j])];
    const int32_t dtype = c.args[static_cast<size_t>(owner[j])].desc.dtype;
    if (f == Fill::kAttnIn) {
      for (size_t b = 0; b + 2 <= n; b += 2) {
        const uint16_t h = half_bits(dtype, rng, special_rate);
        std::memcpy(p + b, &h, 2);
      }
    } else if (f == Fill::kLseIn) {
      for (size_t b = 0; b + 4 <= n; b += 4) {
        const float x = lse_value(rng, special_rate);
        std::memcpy(p + b, &x, 4);
      }
    } else if (f != Fill::kOutput) {
      for (size_t b = 0; b + 4 <= n; b += 4) {
        const int32_t x = index_value(f, c.dims, static_cast<int64_t>(b / 4), in.u8());
        std::memcpy(p + b, &x, 4);
      }
    }
  }
}

// ---- running a call -------------------------------------------------------------------------------

// A call's work (multiply-adds, roughly), judged from its descriptors after mutation: shapes only,
// whether or not they are valid.
using WorkFn = std::function<double(const Call&)>;
using QueryFn = std::function<fva_status_t(fva_handle_t, const void*, const Call&, size_t*)>;
using CallFn = std::function<fva_status_t(fva_handle_t, const void*, const Call&, void*, size_t)>;

const fva_tensor_t* T(const Call& c, size_t i) { return c.args[i].arg(); }

// The config as the caller's memory: exactly struct_size bytes (within reason), so reading past
// what the caller said it has is an out-of-bounds read.
struct ConfigMemory {
  void* p = nullptr;
  explicit ConfigMemory(const Call& c) {
    if (c.cfg.empty() || c.cfg_null) return;
    uint32_t struct_size;
    std::memcpy(&struct_size, c.cfg.data(), 4);
    const size_t bytes = std::min<size_t>(std::max<size_t>(struct_size, 4), c.cfg.size() + 64);
    p = std::calloc(1, bytes);
    std::memcpy(p, c.cfg.data(), std::min(bytes, c.cfg.size()));
  }
  ~ConfigMemory() { std::free(p); }
};

// What an operation does to its arenas before the call under test (the VSA layer's backward: a
// forward fills the reserve); part of the arrangement, so before the snapshot.
using PrepareFn = std::function<void(const Call&)>;

void run(const char* op, Call& c, ByteReader& in, const WorkFn& work, const QueryFn& query,
         const CallFn& call, const PrepareFn& prepare = PrepareFn{}) {
  mutate(c, in);
  bool budget_nulled = false;
  if (work(c) > kWorkBudget) {
    c.args[c.budget_null].pass_null = true;
    budget_nulled = true;
  }
  Arenas arenas;
  arenas.place(c.args);
  fill_arenas(c, arenas, in);
  if (prepare) prepare(c);
  const auto before = arenas.snapshot();
  const ConfigMemory cfg(c);
  fva_handle_t h = c.handle_null ? nullptr : g_cpu;

  fva_status_t qst = FVA_OK;
  size_t need = 0;
  if (query) {
    constexpr size_t kUntouched = 0x5eed5eed;
    size_t bytes = kUntouched;
    qst = query(h, cfg.p, c, &bytes);
    check_status(qst, op, true);
    if (qst != FVA_OK && bytes != kUntouched)
      finding(fmt::format("{} workspace query failed but wrote *bytes", op));
    if (arenas.first_changed(before, false) >= 0)
      finding(fmt::format("{} workspace query wrote tensor memory", op));
    if (qst == FVA_OK) need = bytes;
  }
  // The workspace: what the caller says it has (ws_bytes) but never more than the query asked for,
  // allocated exactly, so a call that ignores a too-small ws_bytes overruns it; none when the query
  // failed or asks for more than kArenaCap.
  size_t ws_bytes = need <= kArenaCap ? need : 0;
  switch (c.ws_size) {
    case 1: ws_bytes = need ? need - 1 : 0; break;
    case 2: ws_bytes = 0; break;
    case 3: ws_bytes = SIZE_MAX; break;
    case 4: ws_bytes = need + in.u8(); break;
    case 5: ws_bytes = need / 2; break;
  }
  const size_t ws_alloc = need <= kArenaCap ? std::min(need, ws_bytes) : 0;
  void* ws_mem = nullptr;
  if (ws_alloc > 0 && posix_memalign(&ws_mem, 64, ws_alloc) != 0) std::abort();
  if (ws_mem) std::memset(ws_mem, 0xCD, ws_alloc);
  void* ws = c.ws_ptr == 1 ? nullptr
             : c.ws_ptr == 2 && ws_mem ? static_cast<char*>(ws_mem) + 8
                                        : ws_mem;

  const fva_status_t st = call(h, cfg.p, c, ws, ws_bytes);
  std::free(ws_mem);
  check_status(st, op);
  if (st != FVA_OK) {
    const int changed = arenas.first_changed(before, false);
    if (changed >= 0)
      finding(fmt::format("{} failed ({}: {}) but changed the buffer of {}", op, fva_status_string(st),
                          fva_last_error(), c.args[static_cast<size_t>(changed)].name));
  } else {
    if (qst != FVA_OK)
      finding(fmt::format("{} succeeded although its workspace query failed", op));
    if (budget_nulled)
      finding(fmt::format("{} succeeded with {} = NULL", op, c.args[c.budget_null].name));
    const int changed = arenas.first_changed(before, true);
    if (changed >= 0)
      finding(fmt::format("{} wrote into the buffer of input {}", op, c.args[static_cast<size_t>(changed)].name));
  }
}

// ---- the operations ---------------------------------------------------------------------------------

// B·Hq·Sq·D·Skv: the multiply-adds of one attention product, from q and k.
double qat_work(const Call& c) {
  return extent_product(c.args[0].desc, 4) *
         static_cast<double>(std::max<int64_t>(c.args[1].desc.shape[2], 1));
}

void qat(ByteReader& in, bool backward) {
  Call c;
  Dims& d = c.dims;
  d = read_layout(in);
  d.D = in.pick<int64_t>({16, 32, 64, 128, 256});
  d.Sq = 1 + in.u8() % 72;
  d.Skv = 1 + in.u8() % 72;
  fva_qat_config_t cfg = FVA_QAT_CONFIG_INIT;
  const uint8_t f = in.u8();
  cfg.causal = f & 1;
  cfg.quantize = (f >> 1) & 1;
  cfg.smooth_k = (f >> 2) & 1;
  cfg.qkv_scale = (f >> 3) & 1;
  cfg.p_scale = ((f >> 4) & 3) % 3;
  cfg.quantize_p_backward = (f >> 6) & 1;
  cfg.high_precision_o = (f >> 7) & 1;
  cfg.quantized_qkv_backward = in.u8() & 1;
  cfg.softmax_scale = in.pick<float>({0.0f, 0.125f, 1.0f, 0.01f});
  c.set_config(cfg);
  c.add("q", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
  c.add("k", attn(d, d.Hkv, d.Skv), Fill::kAttnIn);
  c.add("v", attn(d, d.Hkv, d.Skv), Fill::kAttnIn);
  const fva_tensor_t lse = contiguous(FVA_DTYPE_F32, {d.B, d.Hq, d.Sq});
  const QueryFn q_fwd = [](fva_handle_t h, const void* p, const Call& c, size_t* b) {
    return fva_qat_forward_workspace_size(h, static_cast<const fva_qat_config_t*>(p), T(c, 0), T(c, 1),
                                          T(c, 2), b);
  };
  const QueryFn q_bwd = [](fva_handle_t h, const void* p, const Call& c, size_t* b) {
    return fva_qat_backward_workspace_size(h, static_cast<const fva_qat_config_t*>(p), T(c, 0),
                                           T(c, 1), T(c, 2), b);
  };
  if (!backward) {
    c.add("o", attn(d, d.Hq, d.Sq), Fill::kOutput);
    c.add("o_hp", attn(d, d.Hq, d.Sq), Fill::kOutput);
    c.args.back().pass_null = !cfg.high_precision_o;
    c.add("lse", lse, Fill::kOutput);
    c.budget_null = 5;
    run("fva_qat_forward", c, in, [](const Call& c) { return 2 * qat_work(c); }, q_fwd,
        [](fva_handle_t h, const void* p, const Call& c, void* ws, size_t wsb) {
          return fva_qat_forward(h, static_cast<const fva_qat_config_t*>(p), T(c, 0), T(c, 1), T(c, 2),
                                 T(c, 3), T(c, 4), T(c, 5), ws, wsb, nullptr);
        });
  } else {
    c.add("o_for_bwd", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
    c.add("lse", lse, Fill::kLseIn);
    c.add("dout", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
    c.add("dq", attn(d, d.Hq, d.Sq), Fill::kOutput);
    c.add("dk", attn(d, d.Hkv, d.Skv), Fill::kOutput);
    c.add("dv", attn(d, d.Hkv, d.Skv), Fill::kOutput);
    c.budget_null = 8;
    run("fva_qat_backward", c, in, [](const Call& c) { return 5 * qat_work(c); }, q_bwd,
        [](fva_handle_t h, const void* p, const Call& c, void* ws, size_t wsb) {
          return fva_qat_backward(h, static_cast<const fva_qat_config_t*>(p), T(c, 0), T(c, 1), T(c, 2),
                                  T(c, 3), T(c, 4), T(c, 5), T(c, 6), T(c, 7), T(c, 8), ws, wsb, nullptr);
        });
  }
}

void vsa(ByteReader& in, bool backward) {
  Call c;
  Dims& d = c.dims;
  d = read_layout(in);
  d.D = in.pick<int64_t>({64, 128});
  const int64_t nqb = 1 + in.u8() % 2;
  d.num_kv_blocks = 1 + in.u8() % 3;
  d.max_k = 1 + in.u8() % 4;
  d.Sq = 64 * nqb;
  d.Skv = 64 * d.num_kv_blocks;
  fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;
  cfg.softmax_scale = in.pick<float>({0.0f, 0.125f, 1.0f});
  c.set_config(cfg);
  c.add("q", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
  c.add("k", attn(d, d.Hkv, d.Skv), Fill::kAttnIn);
  c.add("v", attn(d, d.Hkv, d.Skv), Fill::kAttnIn);
  const fva_tensor_t idx = contiguous(FVA_DTYPE_I32, {d.B, d.Hq, nqb, d.max_k});
  const fva_tensor_t num = contiguous(FVA_DTYPE_I32, {d.B, d.Hq, nqb});
  const fva_tensor_t sizes = contiguous(FVA_DTYPE_I32, {d.num_kv_blocks});
  const fva_tensor_t lse = contiguous(FVA_DTYPE_F32, {d.B, d.Hq, d.Sq});
  // Each listed entry costs three (forward) or about ten (backward) 64x64xD block products: per q
  // block row, 64·D multiply-adds per product and entry, at most max_k entries.
  auto work = [](size_t idx_arg, double per_entry) {
    return [idx_arg, per_entry](const Call& c) {
      return per_entry * extent_product(c.args[0].desc, 4) * 64 *
             static_cast<double>(std::max<int64_t>(c.args[idx_arg].desc.shape[3], 1));
    };
  };
  if (!backward) {
    c.add("q2k_idx", idx, Fill::kIndex);
    c.add("q2k_num", num, Fill::kCount);
    c.add("block_sizes", sizes, Fill::kBlockSizes);
    c.add("o", attn(d, d.Hq, d.Sq), Fill::kOutput);
    c.add("lse", lse, Fill::kOutput);
    c.budget_null = 7;
    run("fva_vsa_forward", c, in, work(3, 3),
        [](fva_handle_t h, const void* p, const Call& c, size_t* b) {
          return fva_vsa_forward_workspace_size(h, static_cast<const fva_vsa_config_t*>(p), T(c, 0),
                                                T(c, 1), T(c, 2), T(c, 3), b);
        },
        [](fva_handle_t h, const void* p, const Call& c, void* ws, size_t wsb) {
          return fva_vsa_forward(h, static_cast<const fva_vsa_config_t*>(p), T(c, 0), T(c, 1), T(c, 2),
                                 T(c, 3), T(c, 4), T(c, 5), T(c, 6), T(c, 7), ws, wsb, nullptr);
        });
  } else {
    c.add("o", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
    c.add("lse", lse, Fill::kLseIn);
    c.add("dout", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
    c.add("q2k_idx", idx, Fill::kIndex);
    c.add("q2k_num", num, Fill::kCount);
    c.add("block_sizes", sizes, Fill::kBlockSizes);
    c.add("dq", attn(d, d.Hq, d.Sq), Fill::kOutput);
    c.add("dk", attn(d, d.Hkv, d.Skv), Fill::kOutput);
    c.add("dv", attn(d, d.Hkv, d.Skv), Fill::kOutput);
    c.budget_null = 11;
    run("fva_vsa_backward", c, in, work(6, 10),
        [](fva_handle_t h, const void* p, const Call& c, size_t* b) {
          return fva_vsa_backward_workspace_size(h, static_cast<const fva_vsa_config_t*>(p), T(c, 0),
                                                 T(c, 1), T(c, 2), T(c, 6), b);
        },
        [](fva_handle_t h, const void* p, const Call& c, void* ws, size_t wsb) {
          return fva_vsa_backward(h, static_cast<const fva_vsa_config_t*>(p), T(c, 0), T(c, 1), T(c, 2),
                                  T(c, 3), T(c, 4), T(c, 5), T(c, 6), T(c, 7), T(c, 8), T(c, 9),
                                  T(c, 10), T(c, 11), ws, wsb, nullptr);
        });
  }
}

void invert(ByteReader& in) {
  Call c;
  Dims& d = c.dims;
  d.B = 1 + in.u8() % 2;
  d.Hq = 1 + in.u8() % 3;
  const int64_t nqb = 1 + in.u8() % 4;
  d.num_kv_blocks = 1 + in.u8() % 4;
  d.max_k = 1 + in.u8() % 6;
  c.add("q2k_idx", contiguous(FVA_DTYPE_I32, {d.B, d.Hq, nqb, d.max_k}), Fill::kIndex);
  c.add("q2k_num", contiguous(FVA_DTYPE_I32, {d.B, d.Hq, nqb}), Fill::kCount);
  c.add("k2q_idx", contiguous(FVA_DTYPE_I32, {d.B, d.Hq, d.num_kv_blocks, nqb}), Fill::kOutput);
  c.add("k2q_num", contiguous(FVA_DTYPE_I32, {d.B, d.Hq, d.num_kv_blocks}), Fill::kOutput);
  c.budget_null = 3;
  run("fva_vsa_invert_indices", c, in,
      [](const Call& c) { return extent_product(c.args[0].desc, 4) + extent_product(c.args[2].desc, 4); },
      [](fva_handle_t h, const void*, const Call& c, size_t* b) {
        return fva_vsa_invert_indices_workspace_size(h, T(c, 0), T(c, 2), b);
      },
      [](fva_handle_t h, const void*, const Call& c, void* ws, size_t wsb) {
        return fva_vsa_invert_indices(h, T(c, 0), T(c, 1), T(c, 2), T(c, 3), ws, wsb, nullptr);
      });
}

// The reserve of a VSA layer call: its pointer (NULL for a NULL descriptor) and the bytes the
// caller claims, at most what its arena holds from that pointer.
void* reserve_ptr(const Call& c) {
  const Arg& a = c.args[static_cast<size_t>(c.reserve_arg)];
  return a.pass_null ? nullptr : a.desc.data;
}
size_t reserve_bytes(const Call& c) {
  const Arg& a = c.args[static_cast<size_t>(c.reserve_arg)];
  const std::optional<uint64_t> e = addressed_bytes(a.desc);
  const size_t have = a.ptr == PtrKind::kArena && e ? static_cast<size_t>(*e) : 0;
  switch (c.reserve_size) {
    case 1: return have ? have - 1 : 0;
    case 2: return have / 2;
    case 3: return 0;
    default: return have;
  }
}

// The sizes of a valid layer problem (a query reads no tensor memory: the data pointers only have
// to pass the checks).
bool layer_sizes(const fva_vsa_layer_config_t& cfg, const Dims& d, size_t* ws, size_t* reserve) {
  fva_tensor_t q = attn(d, d.Hq, d.Sq), k = attn(d, d.Hkv, d.Skv);
  q.data = k.data = reinterpret_cast<void*>(uintptr_t{1} << 20);
  return fva_vsa_layer_sizes(g_cpu, &cfg, &q, &k, &k, ws, reserve) == FVA_OK;
}

// The whole VSA layer. Arguments: q, k, v, gate, q_block_sizes, kv_block_sizes, then forward: out,
// q2k_idx, q2k_num, reserve; backward: dout, reserve, dq, dk, dv, dgate. The backward's reserve is
// filled by a forward over the same arenas first (or by one with the gate or topk changed, or not
// at all), so the backward meets real records, mismatched ones and garbage.
void layer(ByteReader& in, bool backward) {
  Call c;
  Dims& d = c.dims;
  d = read_layout(in);
  d.D = in.pick<int64_t>({64, 128});
  const int64_t nqb = 1 + in.u8() % 2;
  d.num_kv_blocks = 1 + in.u8() % 3;
  d.Sq = 64 * nqb;
  d.Skv = 64 * d.num_kv_blocks;
  fva_vsa_layer_config_t cfg = FVA_VSA_LAYER_CONFIG_INIT;
  cfg.topk = in.pick<int32_t>({1, 2, 3, 5});
  cfg.softmax_scale = in.pick<float>({0.0f, 0.125f, 1.0f});
  d.max_k = std::min<int64_t>(cfg.topk, d.num_kv_blocks);
  const uint8_t flags = in.u8();
  const bool gate = (flags & 1) == 0;
  c.reserve_size = (flags >> 1) % 4;
  const int prepare_mode = (flags >> 3) % 4;  // backward: 0 same forward, 1 none, 2 gate, 3 topk
  size_t ws_need = 0, reserve_need = 0;
  if (!layer_sizes(cfg, d, &ws_need, &reserve_need)) finding("fva_vsa_layer_sizes refused a valid problem");
  c.set_config(cfg);
  c.add("q", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
  c.add("k", attn(d, d.Hkv, d.Skv), Fill::kAttnIn);
  c.add("v", attn(d, d.Hkv, d.Skv), Fill::kAttnIn);
  c.add("gate", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
  c.args.back().pass_null = !gate;
  c.add("q_block_sizes", contiguous(FVA_DTYPE_I32, {nqb}), Fill::kBlockSizes);
  c.add("kv_block_sizes", contiguous(FVA_DTYPE_I32, {d.num_kv_blocks}), Fill::kBlockSizes);
  const fva_tensor_t reserve = contiguous(FVA_DTYPE_I32, {static_cast<int64_t>(reserve_need / 4)});
  // The fine branch's work (as vsa()'s) plus the coarse attention's few products.
  auto work = [](double per_entry) {
    return [per_entry](const Call& c) {
      return per_entry * extent_product(c.args[0].desc, 4) * 64 *
                 static_cast<double>(std::max<int64_t>(c.dims.max_k, 1)) +
             4 * extent_product(c.args[0].desc, 4) * static_cast<double>(std::max<int64_t>(c.args[1].desc.shape[2], 1)) / 64;
    };
  };
  const QueryFn query = [](fva_handle_t h, const void* p, const Call& c, size_t* b) {
    size_t reserve = 0;
    return fva_vsa_layer_sizes(h, static_cast<const fva_vsa_layer_config_t*>(p), T(c, 0), T(c, 1), T(c, 2), b,
                               &reserve);
  };
  if (!backward) {
    c.add("out", attn(d, d.Hq, d.Sq), Fill::kOutput);
    c.add("q2k_idx", contiguous(FVA_DTYPE_I32, {d.B, d.Hq, nqb, d.max_k}), Fill::kOutput);
    c.add("q2k_num", contiguous(FVA_DTYPE_I32, {d.B, d.Hq, nqb}), Fill::kOutput);
    c.add("reserve", reserve, Fill::kOutput);
    c.reserve_arg = 9;
    c.budget_null = 6;
    run("fva_vsa_layer_forward", c, in, work(3), query,
        [](fva_handle_t h, const void* p, const Call& c, void* ws, size_t wsb) {
          return fva_vsa_layer_forward(h, static_cast<const fva_vsa_layer_config_t*>(p), T(c, 0), T(c, 1),
                                       T(c, 2), T(c, 3), T(c, 4), T(c, 5), T(c, 6), T(c, 7), T(c, 8),
                                       reserve_ptr(c), reserve_bytes(c), ws, wsb, nullptr);
        });
    return;
  }
  c.add("dout", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
  c.add("reserve", reserve, Fill::kLseIn);  // overwritten by the prepare step's forward
  c.reserve_arg = 7;
  c.add("dq", attn(d, d.Hq, d.Sq), Fill::kOutput);
  c.add("dk", attn(d, d.Hkv, d.Skv), Fill::kOutput);
  c.add("dv", attn(d, d.Hkv, d.Skv), Fill::kOutput);
  c.add("dgate", attn(d, d.Hq, d.Sq), Fill::kOutput);
  c.args.back().pass_null = !gate;
  c.budget_null = 10;
  // The forward that fills the reserve: the call's own arguments (as mutated), its own out.
  const PrepareFn prepare = [prepare_mode](const Call& c) {
    if (prepare_mode == 1 || c.cfg_null || c.handle_null) return;
    fva_vsa_layer_config_t fcfg;
    std::memcpy(&fcfg, c.cfg.data(), sizeof fcfg);
    if (prepare_mode == 3) fcfg.topk = fcfg.topk == 1 ? 2 : 1;
    const fva_tensor_t* gate_arg = T(c, 3);
    if (prepare_mode == 2) gate_arg = gate_arg ? nullptr : T(c, 0);
    size_t ws = 0, rs = 0;
    if (fva_vsa_layer_sizes(g_cpu, &fcfg, T(c, 0), T(c, 1), T(c, 2), &ws, &rs) != FVA_OK || !T(c, 0)) return;
    if (ws > kArenaCap || rs > reserve_bytes(c)) return;
    fva_tensor_t out = *T(c, 0);
    void* out_mem = nullptr;
    void* ws_mem = nullptr;
    const std::optional<uint64_t> out_bytes = addressed_bytes(out);
    if (!out_bytes || *out_bytes > kArenaCap || posix_memalign(&out_mem, 64, *out_bytes) != 0) return;
    if (ws && posix_memalign(&ws_mem, 64, ws) != 0) std::abort();
    out.data = out_mem;
    (void)fva_vsa_layer_forward(g_cpu, &fcfg, T(c, 0), T(c, 1), T(c, 2), gate_arg, T(c, 4), T(c, 5), &out, nullptr,
                                nullptr, reserve_ptr(c), reserve_bytes(c), ws_mem, ws, nullptr);
    std::free(out_mem);
    std::free(ws_mem);
  };
  run("fva_vsa_layer_backward", c, in, work(13), query,
      [](fva_handle_t h, const void* p, const Call& c, void* ws, size_t wsb) {
        return fva_vsa_layer_backward(h, static_cast<const fva_vsa_layer_config_t*>(p), T(c, 0), T(c, 1), T(c, 2),
                                      T(c, 3), T(c, 4), T(c, 5), T(c, 6), reserve_ptr(c), reserve_bytes(c),
                                      T(c, 8), T(c, 9), T(c, 10), T(c, 11), ws, wsb, nullptr);
      },
      prepare);
}

// fva_vsa_tile_plan: grids from small to absurd, tiles from 1 to absurd, each pointer NULL or not.
// Outputs are allocated exactly once the count is known (small grids only): a success must write
// a valid plan, a failure nothing.
void tile_plan(ByteReader& in) {
  int64_t dims[3];
  int32_t tile[3];
  for (int64_t& x : dims) x = (in.u8() & 1) ? interesting64(in) : 1 + in.u8() % 13;
  for (int32_t& x : tile) x = (in.u8() & 1) ? static_cast<int32_t>(interesting32(in)) : 1 + in.u8() % 5;
  const uint8_t nulls = in.u8();
  int64_t nb = -7;
  const fva_status_t st = fva_vsa_tile_plan((nulls & 1) ? nullptr : dims, (nulls & 2) ? nullptr : tile,
                                            nullptr, nullptr, &nb);
  check_status(st, "fva_vsa_tile_plan");
  if (st != FVA_OK) {
    if (st != FVA_ERR_INVALID_ARGUMENT) finding("fva_vsa_tile_plan: a status its documentation does not list");
    if (nb != -7) finding("fva_vsa_tile_plan failed but wrote *num_blocks");
    return;
  }
  const int64_t tokens = dims[0] * dims[1] * dims[2];  // valid dims: at most 2^56
  const int64_t slots = int64_t{tile[0]} * tile[1] * tile[2];
  if (nb < 1 || nb > tokens) finding("fva_vsa_tile_plan: block count out of range");
  if (tokens > 4096 || nb * slots > (int64_t{1} << 20)) return;
  std::vector<int64_t> slot(static_cast<size_t>(tokens), -1);
  std::vector<int32_t> sizes(static_cast<size_t>(nb), -1);
  if (fva_vsa_tile_plan(dims, tile, slot.data(), sizes.data(), nullptr) != FVA_OK)
    finding("fva_vsa_tile_plan: the second call failed");
  int64_t sum = 0;
  for (int32_t s : sizes) {
    if (s < 1 || s > slots) finding("fva_vsa_tile_plan: a block size out of range");
    sum += s;
  }
  if (sum != tokens) finding("fva_vsa_tile_plan: block sizes do not sum to the token count");
  std::vector<char> used(static_cast<size_t>(nb * slots), 0);
  for (int64_t x : slot) {
    if (x < 0 || x >= nb * slots || used[static_cast<size_t>(x)] || x % slots >= sizes[static_cast<size_t>(x / slots)])
      finding("fva_vsa_tile_plan: a token's slot is out of range, shared or in its block's padding");
    used[static_cast<size_t>(x)] = 1;
  }
}

void nvfp4(ByteReader& in) {
  Call c;
  Dims& d = c.dims;
  d = read_layout(in);
  d.D = in.pick<int64_t>({16, 32, 48, 64, 128});
  d.Sq = 1 + in.u8() % 72;
  fva_nvfp4_config_t cfg = FVA_NVFP4_CONFIG_INIT;
  cfg.scale_mode = in.u8() % 2;
  cfg.tile_tokens = 1 + in.u8() % 40;
  c.set_config(cfg);
  c.add("x", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
  c.add("y", attn(d, d.Hq, d.Sq), Fill::kOutput);
  if (in.u8() & 1) c.args[1].arena = 0;  // in place: y is x
  c.budget_null = 1;
  run("fva_nvfp4_fake_quantize", c, in, [](const Call& c) { return 8 * extent_product(c.args[0].desc, 4); },
      QueryFn{},
      [](fva_handle_t h, const void* p, const Call& c, void*, size_t) {
        return fva_nvfp4_fake_quantize(h, static_cast<const fva_nvfp4_config_t*>(p), T(c, 0), T(c, 1),
                                       nullptr);
      });
}

// fva_create with arbitrary options (the options struct exactly as large as struct_size says),
// fva_get_info on what it made, fva_destroy.
void handles(ByteReader& in) {
  fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = in.pick<int32_t>({FVA_BACKEND_CPU, FVA_BACKEND_AUTO, FVA_BACKEND_CUDA, 3, -1, INT32_MAX});
  o.device = in.pick<int32_t>({-1, 0, 1, -2, INT32_MAX, INT32_MIN});
  o.deterministic = in.pick<int32_t>({0, 1, 2, -1});
  if (in.u8() & 1) {  // the tuning options, in and out of range
    o.qat_forward_split = in.pick<int32_t>({FVA_OPTION_AUTO, 0, 1, 2, 8, 9, -2, INT32_MIN});
    o.qat_forward_clusters = in.pick<int32_t>({FVA_OPTION_AUTO, 0, 1, 2});
    o.ds_budget_mib = in.pick<int32_t>({FVA_OPTION_AUTO, 0, 1, 2048, INT32_MAX, -5});
    o.chained_launches = in.pick<int32_t>({FVA_OPTION_AUTO, 0, 1, 3});
    o.cpu_threads = in.pick<int32_t>({FVA_OPTION_AUTO, 1, 2, 4096, 4097, 0});
    o.ptx_jit = in.pick<int32_t>({FVA_OPTION_AUTO, 0, 1, 2});
  }
  const uint8_t shape = in.u8();
  if (shape & 1) o.struct_size = interesting32(in);
  const bool opts_null = (shape & 2) != 0, out_null = (shape & 4) != 0;
  const size_t bytes = std::min<size_t>(std::max<size_t>(o.struct_size, 4), sizeof o + 64);
  void* mem = std::calloc(1, bytes);
  std::memcpy(mem, &o, std::min(bytes, sizeof o));
  fva_handle_t h = reinterpret_cast<fva_handle_t>(uintptr_t{0x1000});
  const fva_status_t st =
      fva_create(out_null ? nullptr : &h, opts_null ? nullptr : static_cast<fva_handle_options_t*>(mem));
  std::free(mem);
  check_status(st, "fva_create");
  if (st != FVA_OK) {
    if (!out_null && h != nullptr) finding("fva_create failed but left *out non-NULL");
    return;
  }
  if (out_null) finding("fva_create succeeded with out = NULL");
  uint32_t info_size = sizeof(fva_handle_info_t);
  if (in.u8() & 1) info_size = interesting32(in);
  // Exactly as large as struct_size says (within reason): writing more is an out-of-bounds write.
  const size_t ibytes = std::min<size_t>(std::max<size_t>(info_size, 4), sizeof(fva_handle_info_t) + 64);
  void* info_mem = std::calloc(1, ibytes);
  std::memcpy(info_mem, &info_size, 4);
  auto* info = static_cast<fva_handle_info_t*>(info_mem);
  const fva_status_t ist = fva_get_info(in.u8() & 1 ? nullptr : h, info);
  check_status(ist, "fva_get_info");
  if (ist == FVA_OK) {  // then ibytes >= the ABI-1 size, which holds the strings
    if (info->struct_size > ibytes || info->struct_size < offsetof(fva_handle_info_t, deterministic))
      finding("fva_get_info: struct_size out of what the caller passed");
    if (info->backend != FVA_BACKEND_CPU) finding("a handle without a CUDA driver is not a CPU handle");
    if (!std::memchr(info->image, 0, sizeof info->image) ||
        !std::memchr(info->device_name, 0, sizeof info->device_name))
      finding("fva_get_info: a string is not NUL-terminated");
  }
  std::free(info_mem);
  if (fva_destroy(h) != FVA_OK) finding("fva_destroy did not return FVA_OK");
}

void misc(ByteReader& in) {
  const int32_t s = static_cast<int32_t>(in.u32());
  if (fva_status_string(s) == nullptr) finding("fva_status_string returned NULL");
  if (fva_version() != FVA_VERSION_MAJOR * 10000 + FVA_VERSION_MINOR * 100 + FVA_VERSION_PATCH)
    finding("fva_version disagrees with the header");
  if (fva_abi_version() != FVA_ABI_VERSION) finding("fva_abi_version disagrees with the header");
  (void)std::strlen(fva_last_error());
  if (fva_destroy(nullptr) != FVA_OK) finding("fva_destroy(NULL) is not a no-op");
}

}  // namespace
}  // namespace fvafuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // No CUDA driver, whatever the machine: every call stays on the CPU backend with host buffers.
  setenv("FVATTN_DISABLE_CUDA", "1", 1);
  if (const char* s = std::getenv("FVA_FUZZ_STATS"); s && *s == '1') std::atexit(fvafuzz::print_stats);
  fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = FVA_BACKEND_CPU;
  o.cpu_threads = 2;  // keep the threaded paths in play, cheaply
  if (fva_create(&fvafuzz::g_cpu, &o) != FVA_OK) {
    fmt::print(stderr, "fvattn_fuzz: cannot create a CPU handle: {}\n", fva_last_error());
    std::abort();
  }
  return 0;
}

// An input is a sequence of calls (at most eight), each an operation byte and what it reads.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fvafuzz::ByteReader in(data, size);
  for (int calls = 0; calls < 8; ++calls) {
    switch (in.u8() % 11) {
      case 0: fvafuzz::qat(in, false); break;
      case 1: fvafuzz::qat(in, true); break;
      case 2: fvafuzz::vsa(in, false); break;
      case 3: fvafuzz::vsa(in, true); break;
      case 4: fvafuzz::invert(in); break;
      case 5: fvafuzz::nvfp4(in); break;
      case 6: fvafuzz::handles(in); break;
      case 7: fvafuzz::misc(in); break;
      case 8: fvafuzz::layer(in, false); break;
      case 9: fvafuzz::layer(in, true); break;
      case 10: fvafuzz::tile_plan(in); break;
    }
    if (in.empty()) break;
  }
  return 0;
}
