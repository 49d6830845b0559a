// `fvattn soak`: random calls of every operation for N minutes, from several threads sharing one
// CUDA handle, each thread on its own two streams; every K-th call of a thread is repeated on the
// CPU backend over the same inputs and compared (SPEC section 4's bounds: 1e-2 for attention
// outputs, 1e-3 for lse, bit for bit for index lists and NVFP4 quantization; NaN and infinities at
// the same elements). Problems are random in everything the API offers: shapes (log-uniform up to
// --max-seq), configs, bf16/f16, BHSD/BSHD with padded rows, ragged, empty, out-of-range and
// duplicated block metadata, a gate or none; a few calls get a workspace one byte short and must be
// refused. Reports the calls per op and status, the checks, the mismatches, device memory at start
// and end (cudaMemGetInfo) and the slowest call; progress every 30 s. `--backend cpu` runs the same
// calls on a second CPU handle over host memory (tools/soak_target.h), which is how CI tests the
// soak itself.
#include <fmt/format.h>
#include <fvattn/fvattn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "reference64.h"
#include "soak_options.h"
#include "soak_target.h"
#include "tensor_desc.h"

namespace fvtool {
namespace {

using Clock = std::chrono::steady_clock;

enum Op { kQatFwd, kQatBwd, kVsaFwd, kVsaBwd, kLayerFwd, kLayerBwd, kNvfp4, kInvert, kOps };
const char* const kOpNames[kOps] = {"qat_forward",  "qat_backward",   "vsa_forward", "vsa_backward",
                                    "layer_forward", "layer_backward", "nvfp4",       "invert_indices"};

// ---- what all threads report --------------------------------------------------------------------------

struct Report {
  std::mutex m;
  std::map<std::string, long> calls;  // "op  STATUS"
  long total = 0, checked = 0, mismatches = 0, unexpected = 0;
  long ties = 0;  // checked VSA layer calls whose lists took the other side of a one-step tie
  bool device_error = false;
  double slowest_ms = 0;
  std::string slowest;
  std::vector<std::string> problems;  // the first few, in full

  void problem(const std::string& what, long* counter) {
    std::lock_guard<std::mutex> lock(m);
    ++*counter;
    if (problems.size() < 20) problems.push_back(what);
  }
};

// ---- one call's tensors, on the host and on the device ------------------------------------------------

// Bytes from a tensor's first element to one past its last.
size_t extent_bytes(const fva_tensor_t& t) {
  int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) last += (t.shape[d] - 1) * t.strides[d];
  return static_cast<size_t>(last + 1) * fvadesc::dtype_size(t.dtype);
}

struct Tensor {
  fva_tensor_t host{}, dev{};
  std::vector<uint8_t> bytes;  // host memory (malloc's 16-byte alignment is what the API asks)
  bool output = false;
  bool keep = false;  // upload leaves the device copy as it is (a reserve the device filled)
};

// The tensors of one call: host memory of their own, device memory carved from the thread's arena.
class Problem {
 public:
  Problem(SoakTarget& target, uint8_t* arena, size_t arena_bytes)
      : target_(target), arena_(arena), cap_(arena_bytes) {}
  int add(fva_tensor_t t, bool output) {
    Tensor x;
    const size_t n = extent_bytes(t);
    x.bytes.assign(n, 0xFF);
    x.output = output;
    x.host = x.dev = t;
    x.host.data = x.bytes.data();
    x.dev.data = carve(n);
    tensors_.push_back(std::move(x));
    return static_cast<int>(tensors_.size()) - 1;
  }
  void* carve(size_t n) {
    const size_t at = (used_ + 255) / 256 * 256;
    if (at + n > cap_) throw std::length_error("the problem does not fit the thread's device arena");
    used_ = at + n;
    return arena_ + at;
  }
  Tensor& operator[](int i) { return tensors_[static_cast<size_t>(i)]; }
  const fva_tensor_t* t(int i, bool dev) const {
    return i < 0 ? nullptr : dev ? &tensors_[static_cast<size_t>(i)].dev : &tensors_[static_cast<size_t>(i)].host;
  }
  // Inputs to the device, outputs poisoned there (0xFF: NaN, or -1 in int32).
  void upload(void* s) {
    for (Tensor& x : tensors_) {
      if (x.keep) continue;
      if (x.output) target_.fill(x.dev.data, 0xFF, x.bytes.size(), s);
      else target_.upload(x.dev.data, x.bytes.data(), x.bytes.size(), s);
    }
  }
  std::vector<uint8_t> download(int i, void* s) {
    const Tensor& x = tensors_[static_cast<size_t>(i)];
    std::vector<uint8_t> b(x.bytes.size());
    target_.download(b.data(), x.dev.data, b.size(), s);
    return b;
  }
  // Device bytes of tensor i become its host input (a device forward's result feeding a backward).
  void adopt(int i, void* s) {
    Tensor& x = tensors_[static_cast<size_t>(i)];
    x.bytes = download(i, s);
    x.host.data = x.bytes.data();  // the host descriptor follows its bytes
    x.output = false;
  }

 private:
  SoakTarget& target_;
  uint8_t* arena_;
  size_t cap_, used_ = 0;
  std::vector<Tensor> tensors_;
};

// ---- random problems ----------------------------------------------------------------------------------

struct Rng {
  std::mt19937_64 g;
  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g); }
  bool one_in(int n) { return uniform(0, n - 1) == 0; }
  // log-uniform in [lo, hi]: mostly small problems, now and then the largest
  int64_t log_uniform(int64_t lo, int64_t hi) {
    const double x = std::uniform_real_distribution<double>(std::log(double(lo)), std::log(double(hi) + 1))(g);
    return std::clamp<int64_t>(static_cast<int64_t>(std::exp(x)), lo, hi);
  }
};

struct Shape {
  int32_t dtype = FVA_DTYPE_BF16;
  bool bshd = false;
  int64_t pad = 0, B = 1, Hq = 1, Hkv = 1, D = 64;
  std::string describe(int64_t Sq, int64_t Skv) const {
    return fmt::format("B{} Hq{} Hkv{} Sq{} Skv{} D{} {}{}{}", B, Hq, Hkv, Sq, Skv, D,
                       dtype == FVA_DTYPE_F16 ? "f16" : "bf16", bshd ? " BSHD" : "", pad ? " padded" : "");
  }
};

Shape random_shape(Rng& r) {
  Shape s;
  s.dtype = r.one_in(2) ? FVA_DTYPE_F16 : FVA_DTYPE_BF16;
  s.bshd = r.one_in(2);
  s.pad = r.one_in(3) ? 8 * r.uniform(1, 4) : 0;
  s.B = r.uniform(1, 2);
  s.Hkv = r.uniform(1, 2);
  s.Hq = s.Hkv * r.uniform(1, 3);
  s.D = r.one_in(2) ? 64 : 128;
  return s;
}

fva_tensor_t attn(const Shape& s, int64_t H, int64_t S) {
  return fvadesc::attention_layout(nullptr, s.dtype, s.B, H, S, s.D, s.bshd, s.pad);
}

fva_tensor_t dense(int32_t dtype, const std::vector<int64_t>& shape) { return fvadesc::contiguous(nullptr, dtype, shape); }

// Moderate values of either sign, |x| in [1/8, 4), as 16-bit patterns of the dtype.
void fill_attn(Tensor& x, Rng& r) {
  for (size_t b = 0; b + 2 <= x.bytes.size(); b += 2) {
    const uint64_t v = r.g();
    const uint16_t sign = static_cast<uint16_t>((v >> 16) & 0x8000);
    const uint16_t h = x.host.dtype == FVA_DTYPE_F16
                           ? static_cast<uint16_t>(sign | ((12 + (v >> 20) % 5) << 10) | ((v >> 24) & 0x3ff))
                           : static_cast<uint16_t>(sign | ((124 + (v >> 20) % 5) << 7) | ((v >> 24) & 0x7f));
    std::memcpy(&x.bytes[b], &h, 2);
  }
}

void fill_i32(Tensor& x, const std::vector<int32_t>& v) {
  std::memcpy(x.bytes.data(), v.data(), std::min(x.bytes.size(), v.size() * 4));
}

// Block metadata as callers send it, good and bad: kv indices mostly in range, some out of range
// (skipped) or repeated (attended once per listing); counts mostly full, some 0, negative or above
// max_k (clamped); sizes mostly full, some ragged, empty, negative or above 64 (clamped).
std::vector<int32_t> random_indices(Rng& r, size_t n, int64_t nkv) {
  std::vector<int32_t> v(n);
  const int32_t wild[] = {-1, static_cast<int32_t>(nkv), static_cast<int32_t>(nkv + 7), INT32_MAX, INT32_MIN};
  for (int32_t& x : v) x = r.one_in(10) ? wild[r.uniform(0, 4)] : static_cast<int32_t>(r.uniform(0, nkv - 1));
  return v;
}
std::vector<int32_t> random_counts(Rng& r, size_t n, int64_t max_k) {
  std::vector<int32_t> v(n);
  for (int32_t& x : v) {
    const int64_t pick = r.uniform(0, 9);
    x = static_cast<int32_t>(pick < 6 ? max_k : pick == 6 ? 0 : pick == 7 ? -3 : pick == 8 ? max_k + 5 : r.uniform(0, max_k));
  }
  return v;
}
std::vector<int32_t> random_sizes(Rng& r, size_t n) {
  std::vector<int32_t> v(n);
  const bool all_empty = r.one_in(16);
  for (int32_t& x : v) {
    const int64_t pick = r.uniform(0, 9);
    x = all_empty ? 0 : static_cast<int32_t>(pick < 5 ? 64 : pick == 5 ? 0 : pick == 6 ? -4 : pick == 7 ? 100 : r.uniform(1, 63));
  }
  return v;
}

// ---- comparing ---------------------------------------------------------------------------------------

double element(int32_t dtype, const uint8_t* p) {
  if (dtype == FVA_DTYPE_F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  if (dtype == FVA_DTYPE_I32) {
    int32_t i;
    std::memcpy(&i, p, 4);
    return i;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  if (dtype == FVA_DTYPE_BF16) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0x1f) return m ? std::nan("") : sign * INFINITY;
  return sign * (e ? std::ldexp(1024 + m, e - 25) : std::ldexp(m, -24));
}

// Calls visit(byte offset) for each element of t in logical order (any strides, rank <= 4).
template <typename Visit>
void for_each_element(const fva_tensor_t& t, Visit visit) {
  const int64_t es = static_cast<int64_t>(fvadesc::dtype_size(t.dtype));
  int64_t idx[4] = {0, 0, 0, 0};
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < t.rank; ++d) off += idx[d] * t.strides[d];
    visit(off * es);
    int d = t.rank - 1;
    while (d >= 0 && ++idx[d] == t.shape[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}

// Sum of squares of tensor x's finite host values (its CPU result).
double sum_of_squares(const Tensor& x) {
  double sum = 0;
  for_each_element(x.host, [&](int64_t at) {
    const double r = element(x.host.dtype, x.bytes.data() + at);
    if (std::isfinite(r)) sum += r * r;
  });
  return sum;
}

// "" when the device's bytes of tensor t agree with the CPU's (host bytes), else what differs.
// The relative L2 error's denominator is at least floor_sq (a sum of squares: see Check::scale_of).
std::string compare(const Tensor& x, const std::vector<uint8_t>& dev, double tol, const char* name,
                    double floor_sq = 0) {
  const fva_tensor_t& t = x.host;
  const size_t es = fvadesc::dtype_size(t.dtype);
  double num = 0, den = 0;
  int64_t n = 0, bad_class = 0, bad_bits = 0;
  for_each_element(t, [&](int64_t at) {
    const uint8_t* a = x.bytes.data() + at;
    const uint8_t* b = dev.data() + at;
    const double r = element(t.dtype, a), g = element(t.dtype, b);
    if (tol == 0) {
      bad_bits += std::memcmp(a, b, es) != 0 && !(std::isnan(r) && std::isnan(g));
    } else if (std::isfinite(r) && std::isfinite(g)) {
      num += (g - r) * (g - r), den += r * r;
    } else if (!(std::isnan(r) && std::isnan(g)) && r != g) {
      ++bad_class;
    }
    ++n;
  });
  if (bad_bits) return fmt::format("{}: {} of {} elements differ bit for bit", name, bad_bits, n);
  if (bad_class) return fmt::format("{}: {} of {} elements differ in NaN/Inf", name, bad_class, n);
  const double e = std::sqrt(num / std::max({den, floor_sq, 1e-6 * static_cast<double>(n)}));
  if (tol > 0 && !(e <= tol)) return fmt::format("{}: rel L2 {:.3e} > {:.0e}", name, e, tol);
  return "";
}

// A [B, H, S, D] tensor's host values (any layout) as the float64 reference's contiguous tensor.
ref64::Tensor to_ref(const Tensor& x) {
  const fva_tensor_t& t = x.host;
  ref64::Tensor r;
  r.shape = {t.shape[0], t.shape[1], t.shape[2], t.shape[3]};
  r.data.resize(static_cast<size_t>(r.shape.numel()));
  size_t i = 0;
  for_each_element(t, [&](int64_t at) { r.data[i++] = element(t.dtype, x.bytes.data() + at); });
  return r;
}

std::vector<int32_t> as_i32(const std::vector<uint8_t>& bytes) {
  std::vector<int32_t> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// ---- one thread's calls ---------------------------------------------------------------------------------

struct Context {
  SoakTarget* target = nullptr;
  fva_handle_t gpu = nullptr, cpu = nullptr;  // the handle under test (CUDA, or a second CPU one), the reference
  const SoakOptions* o = nullptr;
  Report* report = nullptr;
  std::atomic<bool>* stop = nullptr;
};

// An output to compare after the checked call: its tensor, its bound, its name.
struct Check {
  int tensor;
  double tol;
  const char* name;
  // Replaces the element comparison when set: "" when the device's bytes are right, else what
  // differs (the VSA layer's lists, judged by SPEC 3b's tie rule).
  std::function<std::string(const std::vector<uint8_t>& dev)> judge = nullptr;
  // Compared only while *skip is false: a judge earlier in the list may set it (outputs that follow
  // a selection the two backends made differently, within a tie, are not comparable).
  const bool* skip = nullptr;
  // When >= 0, the error is measured relative to at least this tensor's CPU result (its L2 norm):
  // for an output that is zero in exact arithmetic, whose two results are rounding residue (dk of
  // a problem with one key: P = 1, so dS = dP - Delta cancels), against the scale of a sibling
  // output of the same rows that does not cancel (dv).
  int scale_of = -1;
};

using Run = std::function<fva_status_t(fva_handle_t, bool dev, void* ws, size_t ws_bytes, void* stream)>;
using Query = std::function<fva_status_t(fva_handle_t, bool dev, size_t*)>;

class Worker {
 public:
  Worker(const Context& c, int index)
      : c_(c), index_(index) {
    rng_.g.seed(c.o->seed * 1000003 + static_cast<uint64_t>(index));
    for (void*& s : streams_) s = c.target->new_stream();
    // Room for the largest problem: a dozen attention tensors at --max-seq, B = 2, Hq = 6, D = 128
    // (padded), and their workspace.
    const size_t tensor = 2ull * 6 * static_cast<size_t>(c.o->max_seq) * (128 + 32) * 2;
    arena_bytes_ = 24 * tensor + (size_t{256} << 20);
    arena_ = c.target->allocate(arena_bytes_);
  }
  ~Worker() {
    c_.target->release(arena_);
    for (void* s : streams_) c_.target->delete_stream(s);
  }

  // One random call (with the calls it needs first), checked against the CPU when `check`.
  void step(bool check) {
    const Op op = static_cast<Op>(rng_.uniform(0, kOps - 1));
    void* s = streams_[calls_++ % 2];
    Problem p(*c_.target, static_cast<uint8_t*>(arena_), arena_bytes_);
    switch (op) {
      case kQatFwd: case kQatBwd: qat(p, op == kQatBwd, check, s); break;
      case kVsaFwd: case kVsaBwd: vsa(p, op == kVsaBwd, check, s); break;
      case kLayerFwd: case kLayerBwd: layer(p, op == kLayerBwd, check, s); break;
      case kNvfp4: nvfp4(p, check, s); break;
      default: invert(p, check, s); break;
    }
  }

 private:
  // Runs one call on the device (timed, counted, its status checked), and when `check` the same
  // call on the CPU backend over the host copies, then compares `outputs`.
  // Returns whether the target's call succeeded (a backward then has its forward's outputs).
  bool call(Problem& p, Op op, const std::string& what, const Query& query, const Run& run,
            const std::vector<Check>& outputs, bool check, void* s) {
    size_t need = 0;
    fva_status_t st = query ? query(c_.gpu, true, &need) : FVA_OK;
    const bool short_ws = query && st == FVA_OK && need > 0 && rng_.one_in(20);
    void* ws = st == FVA_OK && need ? p.carve(need) : nullptr;
    p.upload(s);
    const auto t0 = Clock::now();
    if (st == FVA_OK) st = run(c_.gpu, true, ws, short_ws ? need - 1 : need, s);
    const std::string e = c_.target->sync(s);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    const fva_status_t want = short_ws ? FVA_ERR_WORKSPACE_TOO_SMALL : FVA_OK;
    {
      std::lock_guard<std::mutex> lock(c_.report->m);
      ++c_.report->total;
      ++c_.report->calls[fmt::format("{:<16} {}", kOpNames[op], fva_status_string(st))];
      if (ms > c_.report->slowest_ms) c_.report->slowest_ms = ms, c_.report->slowest = fmt::format("{} {}", kOpNames[op], what);
    }
    if (!e.empty()) {
      c_.report->problem(fmt::format("thread {}: {} {}: device error {}", index_, kOpNames[op], what, e),
                         &c_.report->unexpected);
      c_.report->device_error = true;
      c_.stop->store(true);
      throw std::runtime_error("device error");
    }
    if (st != want) {
      c_.report->problem(fmt::format("thread {}: {} {}: {} ({}), expected {}", index_, kOpNames[op], what,
                                     fva_status_string(st), fva_last_error(), fva_status_string(want)),
                         &c_.report->unexpected);
      return false;
    }
    if (!check || short_ws) return st == FVA_OK;
    size_t cpu_need = 0;
    if (query && query(c_.cpu, false, &cpu_need) != FVA_OK) throw std::runtime_error("CPU workspace query failed");
    std::vector<uint8_t> cpu_ws(cpu_need + 64);
    void* cws = cpu_need ? reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(cpu_ws.data()) + 63) / 64 * 64) : nullptr;
    const fva_status_t cst = run(c_.cpu, false, cws, cpu_need, nullptr);
    if (cst != FVA_OK) {
      c_.report->problem(fmt::format("thread {}: {} {}: the CPU backend says {} ({})", index_, kOpNames[op], what,
                                     fva_status_string(cst), fva_last_error()), &c_.report->unexpected);
      return true;
    }
    std::string diff;
    for (const Check& k : outputs) {
      if (k.skip != nullptr && *k.skip) continue;
      const std::vector<uint8_t> dev = p.download(k.tensor, s);
      diff = k.judge ? k.judge(dev)
                     : compare(p[k.tensor], dev, k.tol, k.name, k.scale_of >= 0 ? sum_of_squares(p[k.scale_of]) : 0);
      if (!diff.empty()) break;
    }
    {
      std::lock_guard<std::mutex> lock(c_.report->m);
      ++c_.report->checked;
    }
    if (!diff.empty())
      c_.report->problem(fmt::format("thread {}: {} {}: {}", index_, kOpNames[op], what, diff), &c_.report->mismatches);
    return true;
  }

  int64_t seq() { return rng_.log_uniform(1, c_.o->max_seq); }
  int64_t blocks() { return rng_.log_uniform(1, std::max<int64_t>(1, c_.o->max_seq / 64)); }

  void qat(Problem& p, bool backward, bool check, void* s) {
    Shape sh = random_shape(rng_);
    const int64_t Sq = seq(), Skv = rng_.one_in(2) ? Sq : seq();
    fva_qat_config_t cfg = FVA_QAT_CONFIG_INIT;
    cfg.quantize = rng_.one_in(2);
    cfg.causal = rng_.one_in(3);
    cfg.smooth_k = rng_.one_in(4);
    cfg.qkv_scale = static_cast<int32_t>(rng_.uniform(0, 1));
    cfg.p_scale = static_cast<int32_t>(rng_.uniform(0, 2));
    cfg.quantize_p_backward = rng_.one_in(2);
    cfg.high_precision_o = rng_.one_in(2);
    cfg.quantized_qkv_backward = rng_.one_in(2);
    const std::string what = fmt::format("{}{} {}", cfg.quantize ? "quantized" : "plain", cfg.causal ? " causal" : "",
                                         sh.describe(Sq, Skv));
    const int q = p.add(attn(sh, sh.Hq, Sq), false), k = p.add(attn(sh, sh.Hkv, Skv), false),
              v = p.add(attn(sh, sh.Hkv, Skv), false);
    for (int i : {q, k, v}) fill_attn(p[i], rng_);
    const int o = p.add(attn(sh, sh.Hq, Sq), true);
    const int o_hp = cfg.high_precision_o ? p.add(attn(sh, sh.Hq, Sq), true) : -1;
    const int lse = p.add(dense(FVA_DTYPE_F32, {sh.B, sh.Hq, Sq}), true);
    const Query qf = [&](fva_handle_t h, bool d, size_t* b) {
      return fva_qat_forward_workspace_size(h, &cfg, p.t(q, d), p.t(k, d), p.t(v, d), b);
    };
    const Run fwd = [&](fva_handle_t h, bool d, void* ws, size_t wb, void* st) {
      return fva_qat_forward(h, &cfg, p.t(q, d), p.t(k, d), p.t(v, d), p.t(o, d), p.t(o_hp, d), p.t(lse, d), ws,
                             wb, st);
    };
    std::vector<Check> fwd_out = {{o, 1e-2, "o"}, {lse, 1e-3, "lse"}};
    if (o_hp >= 0) fwd_out.push_back({o_hp, 1e-2, "o_hp"});
    if (!call(p, kQatFwd, what, qf, fwd, fwd_out, check && !backward, s) || !backward) return;
    // The backward over the device forward's o (or o_hp) and lse.
    const int ob = o_hp >= 0 ? o_hp : o;
    p.adopt(ob, s);
    p.adopt(lse, s);
    const int dout = p.add(attn(sh, sh.Hq, Sq), false);
    fill_attn(p[dout], rng_);
    const int dq = p.add(attn(sh, sh.Hq, Sq), true), dk = p.add(attn(sh, sh.Hkv, Skv), true),
              dv = p.add(attn(sh, sh.Hkv, Skv), true);
    const Query qb = [&](fva_handle_t h, bool d, size_t* b) {
      return fva_qat_backward_workspace_size(h, &cfg, p.t(q, d), p.t(k, d), p.t(v, d), b);
    };
    const Run bwd = [&](fva_handle_t h, bool d, void* ws, size_t wb, void* st) {
      return fva_qat_backward(h, &cfg, p.t(q, d), p.t(k, d), p.t(v, d), p.t(ob, d), p.t(lse, d), p.t(dout, d),
                              p.t(dq, d), p.t(dk, d), p.t(dv, d), ws, wb, st);
    };
    // With one key, dq and dk are zero in exact arithmetic: measured against the scale of dout
    // and dv (the same rows' and keys' sums, without the cancellation).
    Check dq_check{dq, 1e-2, "dq"}, dk_check{dk, 1e-2, "dk"};
    if (Skv == 1) dq_check.scale_of = dout, dk_check.scale_of = dv;
    call(p, kQatBwd, what, qb, bwd, {dq_check, dk_check, {dv, 1e-2, "dv"}}, check, s);
  }

  void vsa(Problem& p, bool backward, bool check, void* s) {
    Shape sh = random_shape(rng_);
    const int64_t nq = blocks(), nkv = blocks(), max_k = rng_.uniform(1, nkv + 1);
    fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;
    const std::string what = fmt::format("max_k {} {}", max_k, sh.describe(64 * nq, 64 * nkv));
    const int q = p.add(attn(sh, sh.Hq, 64 * nq), false), k = p.add(attn(sh, sh.Hkv, 64 * nkv), false),
              v = p.add(attn(sh, sh.Hkv, 64 * nkv), false);
    for (int i : {q, k, v}) fill_attn(p[i], rng_);
    const size_t lists = static_cast<size_t>(sh.B * sh.Hq * nq);
    const int idx = p.add(dense(FVA_DTYPE_I32, {sh.B, sh.Hq, nq, max_k}), false);
    const int num = p.add(dense(FVA_DTYPE_I32, {sh.B, sh.Hq, nq}), false);
    const int sizes = p.add(dense(FVA_DTYPE_I32, {nkv}), false);
    fill_i32(p[idx], random_indices(rng_, lists * static_cast<size_t>(max_k), nkv));
    fill_i32(p[num], random_counts(rng_, lists, max_k));
    fill_i32(p[sizes], random_sizes(rng_, static_cast<size_t>(nkv)));
    const int o = p.add(attn(sh, sh.Hq, 64 * nq), true);
    const int lse = p.add(dense(FVA_DTYPE_F32, {sh.B, sh.Hq, 64 * nq}), true);
    const Query qf = [&](fva_handle_t h, bool d, size_t* b) {
      return fva_vsa_forward_workspace_size(h, &cfg, p.t(q, d), p.t(k, d), p.t(v, d), p.t(idx, d), b);
    };
    const Run fwd = [&](fva_handle_t h, bool d, void* ws, size_t wb, void* st) {
      return fva_vsa_forward(h, &cfg, p.t(q, d), p.t(k, d), p.t(v, d), p.t(idx, d), p.t(num, d), p.t(sizes, d),
                             p.t(o, d), p.t(lse, d), ws, wb, st);
    };
    if (!call(p, kVsaFwd, what, qf, fwd, {{o, 1e-2, "o"}, {lse, 1e-3, "lse"}}, check && !backward, s) || !backward)
      return;
    p.adopt(o, s);
    p.adopt(lse, s);
    const int dout = p.add(attn(sh, sh.Hq, 64 * nq), false);
    fill_attn(p[dout], rng_);
    const int dq = p.add(attn(sh, sh.Hq, 64 * nq), true), dk = p.add(attn(sh, sh.Hkv, 64 * nkv), true),
              dv = p.add(attn(sh, sh.Hkv, 64 * nkv), true);
    const Query qb = [&](fva_handle_t h, bool d, size_t* b) {
      return fva_vsa_backward_workspace_size(h, &cfg, p.t(q, d), p.t(k, d), p.t(v, d), p.t(idx, d), b);
    };
    const Run bwd = [&](fva_handle_t h, bool d, void* ws, size_t wb, void* st) {
      return fva_vsa_backward(h, &cfg, p.t(q, d), p.t(k, d), p.t(v, d), p.t(o, d), p.t(lse, d), p.t(dout, d),
                              p.t(idx, d), p.t(num, d), p.t(sizes, d), p.t(dq, d), p.t(dk, d), p.t(dv, d), ws,
                              wb, st);
    };
    call(p, kVsaBwd, what, qb, bwd, {{dq, 1e-2, "dq"}, {dk, 1e-2, "dk"}, {dv, 1e-2, "dv"}}, check, s);
  }

  void layer(Problem& p, bool backward, bool check, void* s) {
    Shape sh = random_shape(rng_);
    const int64_t nq = blocks(), nkv = blocks();
    fva_vsa_layer_config_t cfg = FVA_VSA_LAYER_CONFIG_INIT;
    cfg.topk = static_cast<int32_t>(rng_.uniform(1, nkv + 1));
    // A checked call returns its lists, which the check needs to tell a tie from a difference.
    const bool gated = rng_.one_in(2), lists = check || rng_.one_in(2);
    const std::string what = fmt::format("topk {}{} {}", cfg.topk, gated ? " gated" : "", sh.describe(64 * nq, 64 * nkv));
    const int q = p.add(attn(sh, sh.Hq, 64 * nq), false), k = p.add(attn(sh, sh.Hkv, 64 * nkv), false),
              v = p.add(attn(sh, sh.Hkv, 64 * nkv), false);
    const int gate = gated ? p.add(attn(sh, sh.Hq, 64 * nq), false) : -1;
    for (int i : {q, k, v, gate})
      if (i >= 0) fill_attn(p[i], rng_);
    const int qs = p.add(dense(FVA_DTYPE_I32, {nq}), false), ks = p.add(dense(FVA_DTYPE_I32, {nkv}), false);
    fill_i32(p[qs], random_sizes(rng_, static_cast<size_t>(nq)));
    fill_i32(p[ks], random_sizes(rng_, static_cast<size_t>(nkv)));
    size_t ws_bytes = 0, reserve_bytes = 0;
    if (fva_vsa_layer_sizes(c_.gpu, &cfg, p.t(q, true), p.t(k, true), p.t(v, true), &ws_bytes, &reserve_bytes) != FVA_OK)
      throw std::runtime_error(fmt::format("fva_vsa_layer_sizes: {}", fva_last_error()));
    const int reserve = p.add(dense(FVA_DTYPE_I32, {static_cast<int64_t>((reserve_bytes + 3) / 4)}), true);
    const int out = p.add(attn(sh, sh.Hq, 64 * nq), true);
    const int64_t topk = std::min<int64_t>(cfg.topk, nkv);
    const int idx = lists ? p.add(dense(FVA_DTYPE_I32, {sh.B, sh.Hq, nq, topk}), true) : -1;
    const int num = lists ? p.add(dense(FVA_DTYPE_I32, {sh.B, sh.Hq, nq}), true) : -1;
    const Query sizes = [&](fva_handle_t h, bool d, size_t* b) {
      size_t r = 0;
      return fva_vsa_layer_sizes(h, &cfg, p.t(q, d), p.t(k, d), p.t(v, d), b, &r);
    };
    const Run fwd = [&](fva_handle_t h, bool d, void* ws, size_t wb, void* st) {
      return fva_vsa_layer_forward(h, &cfg, p.t(q, d), p.t(k, d), p.t(v, d), p.t(gate, d), p.t(qs, d), p.t(ks, d),
                                   p.t(out, d), p.t(idx, d), p.t(num, d), p.t(reserve, d)->data, reserve_bytes, ws,
                                   wb, st);
    };
    // The lists first: where the device's differ from the CPU's only within one-step ties of the
    // coarse scores (SPEC 3b: the two backends sum those scores in different orders), each backend
    // goes on with its own selection, and out and the gradients are not comparable.
    bool tied = false;
    const Check list_check{idx, 0, "q2k_idx", [&](const std::vector<uint8_t>& dev) -> std::string {
      const std::vector<int32_t> got = as_i32(dev), got_num = as_i32(p.download(num, s));
      ref64::VsaLayerSelection cpu;
      cpu.k = topk;
      cpu.q2k_idx = as_i32(p[idx].bytes);
      cpu.q2k_num = as_i32(p[num].bytes);
      if (got == cpu.q2k_idx && got_num == cpu.q2k_num) return "";
      ref64::VsaLayerInputs in;
      in.q = to_ref(p[q]), in.k = to_ref(p[k]), in.v = to_ref(p[v]);
      in.has_gate = gated;
      if (gated) in.gate = to_ref(p[gate]);
      in.q_block_sizes = as_i32(p[qs].bytes);
      in.kv_block_sizes = as_i32(p[ks].bytes);
      ref64::VsaLayerConfig rc;
      rc.topk = cfg.topk;
      rc.softmax_scale = cfg.softmax_scale;
      const ref64::DType dt = sh.dtype == FVA_DTYPE_F16 ? ref64::DType::F16 : ref64::DType::BF16;
      const ref64::VsaLayerForward ref = ref64::vsa_layer_forward(rc, dt, in);
      const ref64::SelectionCheck sel = ref64::check_selection(dt, got, got_num, ref.scores, in.kv_block_sizes,
                                                               sh.B * sh.Hq * nq, cfg.topk, &cpu);
      if (sel.bad_rows > 0) return fmt::format("q2k_idx: {} q blocks differ beyond a tie; {}", sel.bad_rows, sel.first_bad);
      tied = true;
      std::lock_guard<std::mutex> lock(c_.report->m);
      ++c_.report->ties;
      return "";
    }};
    std::vector<Check> fwd_out;
    if (lists) fwd_out.push_back(list_check);
    fwd_out.push_back({out, 1e-2, "out", nullptr, &tied});
    // A backward needs the reserve its forward filled: none after a refused forward.
    if (!call(p, kLayerFwd, what, sizes, fwd, fwd_out, check, s) || !backward) return;
    const int dout = p.add(attn(sh, sh.Hq, 64 * nq), false);
    fill_attn(p[dout], rng_);
    const int dq = p.add(attn(sh, sh.Hq, 64 * nq), true), dk = p.add(attn(sh, sh.Hkv, 64 * nkv), true),
              dv = p.add(attn(sh, sh.Hkv, 64 * nkv), true);
    const int dgate = gated ? p.add(attn(sh, sh.Hq, 64 * nq), true) : -1;
    if (check) {  // the CPU's reserve comes from the CPU's own forward (the forward was checked above)
      std::vector<uint8_t> ws(ws_bytes + 64);
      void* w = ws_bytes ? reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.data()) + 63) / 64 * 64) : nullptr;
      if (fwd(c_.cpu, false, w, ws_bytes, nullptr) != FVA_OK) throw std::runtime_error("CPU layer forward failed");
    }
    const Run bwd = [&](fva_handle_t h, bool d, void* ws, size_t wb, void* st) {
      return fva_vsa_layer_backward(h, &cfg, p.t(q, d), p.t(k, d), p.t(v, d), p.t(gate, d), p.t(qs, d), p.t(ks, d),
                                    p.t(dout, d), p.t(reserve, d)->data, reserve_bytes, p.t(dq, d), p.t(dk, d),
                                    p.t(dv, d), p.t(dgate, d), ws, wb, st);
    };
    // Gradients after a tie in the forward's lists follow different selections: not compared.
    std::vector<Check> bwd_out = {{dq, 1e-2, "dq", nullptr, &tied}, {dk, 1e-2, "dk", nullptr, &tied},
                                  {dv, 1e-2, "dv", nullptr, &tied}};
    if (gated) bwd_out.push_back({dgate, 1e-2, "dgate", nullptr, &tied});
    // Each backend reads the reserve its own forward wrote: the device keeps the device forward's,
    // the host copy is the CPU forward's.
    p[reserve].output = false;
    p[reserve].keep = true;
    call(p, kLayerBwd, what, sizes, bwd, bwd_out, check, s);
  }

  void nvfp4(Problem& p, bool check, void* s) {
    Shape sh = random_shape(rng_);
    sh.D = 16 * rng_.uniform(1, 8);
    const int64_t S = seq();
    fva_nvfp4_config_t cfg = FVA_NVFP4_CONFIG_INIT;
    cfg.scale_mode = static_cast<int32_t>(rng_.uniform(0, 1));
    cfg.tile_tokens = static_cast<int32_t>(rng_.uniform(1, 64));
    const bool in_place = rng_.one_in(4);
    const std::string what = fmt::format("mode {}{} {}", cfg.scale_mode, in_place ? " in place" : "", sh.describe(S, S));
    const int x = p.add(attn(sh, sh.Hq, S), false);
    fill_attn(p[x], rng_);
    const int y = in_place ? x : p.add(attn(sh, sh.Hq, S), true);
    const Run run = [&](fva_handle_t h, bool d, void*, size_t, void* st) {
      return fva_nvfp4_fake_quantize(h, &cfg, p.t(x, d), p.t(y, d), st);
    };
    if (in_place) {  // the CPU's copy of x is overwritten by its own run: compare against a copy
      call(p, kNvfp4, what, Query{}, run, {}, false, s);
      if (!check) return;
      const std::vector<uint8_t> dev = p.download(x, s);
      if (run(c_.cpu, false, nullptr, 0, nullptr) != FVA_OK) throw std::runtime_error("CPU nvfp4 failed");
      const std::string diff = compare(p[x], dev, 0, "y (in place)");
      { std::lock_guard<std::mutex> lock(c_.report->m); ++c_.report->checked; }
      if (!diff.empty()) c_.report->problem(fmt::format("thread {}: nvfp4 {}: {}", index_, what, diff), &c_.report->mismatches);
      return;
    }
    call(p, kNvfp4, what, Query{}, run, {{y, 0, "y"}}, check, s);
  }

  void invert(Problem& p, bool check, void* s) {
    const int64_t B = rng_.uniform(1, 2), H = rng_.uniform(1, 4), nq = blocks(), nkv = blocks(),
                  max_k = rng_.uniform(1, nkv + 1);
    const std::string what = fmt::format("B{} H{} nq{} nkv{} max_k{}", B, H, nq, nkv, max_k);
    const int idx = p.add(dense(FVA_DTYPE_I32, {B, H, nq, max_k}), false);
    const int num = p.add(dense(FVA_DTYPE_I32, {B, H, nq}), false);
    fill_i32(p[idx], random_indices(rng_, static_cast<size_t>(B * H * nq * max_k), nkv));
    fill_i32(p[num], random_counts(rng_, static_cast<size_t>(B * H * nq), max_k));
    const int kidx = p.add(dense(FVA_DTYPE_I32, {B, H, nkv, nq}), true);
    const int knum = p.add(dense(FVA_DTYPE_I32, {B, H, nkv}), true);
    const Query q = [&](fva_handle_t h, bool d, size_t* b) {
      return fva_vsa_invert_indices_workspace_size(h, p.t(idx, d), p.t(kidx, d), b);
    };
    const Run run = [&](fva_handle_t h, bool d, void* ws, size_t wb, void* st) {
      return fva_vsa_invert_indices(h, p.t(idx, d), p.t(num, d), p.t(kidx, d), p.t(knum, d), ws, wb, st);
    };
    call(p, kInvert, what, q, run, {{kidx, 0, "k2q_idx"}, {knum, 0, "k2q_num"}}, check, s);
  }

  const Context& c_;
  int index_;
  Rng rng_;
  void* streams_[2] = {nullptr, nullptr};
  void* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  long calls_ = 0;
};

}  // namespace

int cmd_soak(const SoakOptions& opts) {
  SoakOptions o = opts;
  if (!o.seed_set) o.seed = std::random_device{}();
  Report report;
  std::atomic<bool> stop{false};
  Context c;
  c.o = &o;
  c.report = &report;
  c.stop = &stop;
  const bool on_cuda = o.backend == "cuda";
  fva_handle_options_t ho = FVA_HANDLE_OPTIONS_INIT;
  ho.backend = on_cuda ? FVA_BACKEND_CUDA : FVA_BACKEND_CPU;
  if (fva_create(&c.gpu, &ho) != FVA_OK) {
    fmt::print(stderr, "fvattn soak: no {} handle: {}\n", on_cuda ? "CUDA" : "CPU", fva_last_error());
    return 1;
  }
  ho.backend = FVA_BACKEND_CPU;
  if (fva_create(&c.cpu, &ho) != FVA_OK) {
    fmt::print(stderr, "fvattn soak: no CPU handle: {}\n", fva_last_error());
    return 1;
  }
  fva_handle_info_t info{};
  info.struct_size = sizeof info;
  fva_get_info(c.gpu, &info);
  std::unique_ptr<SoakTarget> target;
  try {
    target = on_cuda ? make_cuda_target(info.device) : make_host_target();
  } catch (const std::exception& e) {
    fmt::print(stderr, "fvattn soak: {}\n", e.what());
    return 1;
  }
  if (!target) {
    fmt::print(stderr, "fvattn soak: this fvattn was built without CUDA; --backend cpu runs the soak on the CPU\n");
    return 1;
  }
  c.target = target.get();
  if (on_cuda)
    fmt::print("fvattn soak: {} min, {} threads on one handle ({}, {}), seed {}, check every {}, max seq {}\n",
               o.minutes, o.threads, info.device_name, info.image, o.seed, o.check_every, o.max_seq);
  else
    fmt::print("fvattn soak: {} min, {} threads on one CPU handle against another, seed {}, check every {}, "
               "max seq {}\n", o.minutes, o.threads, o.seed, o.check_every, o.max_seq);

  int rc = 0;
  double used0 = 0, used1 = 0, total = 0;
  bool measured = false;
  {
    std::vector<std::unique_ptr<Worker>> workers;
    try {
      for (int t = 0; t < o.threads; ++t) workers.push_back(std::make_unique<Worker>(c, t));
    } catch (const std::exception& e) {
      fmt::print(stderr, "fvattn soak: {}\n", e.what());
      return 1;
    }
    // A warm-up call of each kind per thread loads the kernels it touches before the baseline.
    for (auto& w : workers)
      for (int i = 0; i < 2 * kOps; ++i) {
        try {
          w->step(false);
        } catch (const std::exception&) {
          if (stop.load()) break;  // a device error, reported; else a problem too large, skipped
        }
      }
    std::string err = target->sync_all();
    measured = err.empty() && target->memory_in_use(&used0, &total);
    if (measured)
      fmt::print("{} memory at start: {:.1f} MiB used of {:.1f} MiB\n", target->name(), used0, total);
    const auto t0 = Clock::now();
    const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.minutes * 60));
    std::vector<std::thread> threads;
    for (int t = 0; t < o.threads; ++t)
      threads.emplace_back([&, t] {
        long n = 0;
        while (!stop.load() && Clock::now() < deadline) {
          try {
            workers[static_cast<size_t>(t)]->step(++n % o.check_every == 0);
          } catch (const std::length_error&) {
            // a problem larger than the arena: drawn again
          } catch (const std::exception& e) {
            if (!stop.load()) report.problem(fmt::format("thread {}: {}", t, e.what()), &report.unexpected);
          }
        }
      });
    auto next = t0 + std::chrono::seconds(30);
    while (Clock::now() < deadline && !stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (Clock::now() >= next) {
        std::lock_guard<std::mutex> lock(report.m);
        fmt::print("  {:6.0f} s: {} calls, {} checked, {} mismatches, {} unexpected\n",
                   std::chrono::duration<double>(Clock::now() - t0).count(), report.total, report.checked,
                   report.mismatches, report.unexpected);
        std::fflush(stdout);
        next += std::chrono::seconds(30);
      }
    }
    for (std::thread& t : threads) t.join();
    if (!report.device_error) {
      err = target->sync_all();
      measured = measured && err.empty() && target->memory_in_use(&used1, &total);
    }
  }

  fmt::print("\n{:<36} {:>10}\n", "calls (op, status)", "count");
  for (const auto& [what, n] : report.calls) fmt::print("{:<36} {:>10}\n", what, n);
  fmt::print("total {} calls, {} checked against the CPU backend, {} mismatches, {} unexpected\n", report.total,
             report.checked, report.mismatches, report.unexpected);
  if (report.ties > 0)
    fmt::print("{} checked VSA layer calls chose the other side of a one-step tie of the coarse scores (SPEC 3b); "
               "their outputs were not compared\n", report.ties);
  fmt::print("slowest call: {:.1f} ms ({})\n", report.slowest_ms, report.slowest);
  for (const std::string& p : report.problems) fmt::print("  {}\n", p);
  if (report.device_error) {
    fmt::print("FAIL: the device reported an error; memory not measured\n");
    rc = 1;
  } else if (measured) {
    fmt::print("{} memory: {:.1f} MiB used at start, {:.1f} MiB at end, growth {:+.1f} MiB (slack {:.0f})\n",
               target->name(), used0, used1, used1 - used0, o.slack_mib);
    if (used1 - used0 > o.slack_mib) rc = 1;
  } else {
    fmt::print("{} memory: not measured\n", target->name());
  }
  if (report.checked == 0) {
    fmt::print("FAIL: no call was checked (raise --minutes or lower --check-every)\n");
    rc = 1;
  }
  if (report.mismatches || report.unexpected) rc = 1;
  fmt::print("{}\n", rc == 0 ? "PASS" : "FAIL");
  fva_destroy(c.gpu);
  fva_destroy(c.cpu);
  return rc;
}

}  // namespace fvtool
