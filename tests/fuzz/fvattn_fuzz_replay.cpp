// fvattn_fuzz_replay: the fuzz target's inputs replayed on two handles, the CPU backend (the oracle)
// and a target: a CUDA handle over device memory (--target cuda), or a second CPU handle with
// another thread count over its own host memory (--target cpu, which runs anywhere and checks the
// decoding and the replay itself). No libFuzzer: a plain program, meant to run under
// compute-sanitizer (memcheck on the corpus, racecheck on a sample).
//
// Each input file is decoded by the fuzz target's own decoder (fuzz_call.h) into the same calls.
// For each tensor operation: the host arenas are placed and filled; the call runs on the CPU handle;
// every arena is mirrored into the target's memory (the bytes of output tensors poisoned with 0xFF:
// NaN in bf16, f16 and f32, -1 in int32), the descriptors' data pointers are moved into the copies
// (NULL, odd and top pointers stay: those calls must fail before touching memory), and the call runs
// on the target. Then (replay_compare.h): the statuses must agree as the contract says; on success
// every output agrees with the CPU's within SPEC's bounds and nothing else changed, on failure no
// byte changed. Host-only steps (tile plans, version queries) are decoded and skipped; handle
// creation runs on this machine as it is.
//
// One line per input, a summary, exit status 0 when every call agreed, 1 on any mismatch, 2 on a
// usage error, 3 when an input runs past --timeout seconds, 77 when --target cuda finds no GPU.
#include <fmt/format.h>
#include <fvattn/fvattn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "byte_reader.h"
#include "fuzz_call.h"
#include "memory_model.h"
#include "replay_compare.h"
#include "support/cuda_memory.h"

namespace fvafuzz {

void finding(const std::string& what) {
  fmt::print(stderr, "\nfvattn_fuzz_replay: {}\n", what);
  std::exit(1);
}

}  // namespace fvafuzz

namespace {

using namespace fvafuzz;

// The target backend: a handle and memory of its kind.
class Target : public Memory {
 public:
  ~Target() override { fva_destroy(h_); }
  fva_handle_t handle() const { return h_; }
  virtual bool is_cuda() const = 0;
  virtual void upload(void* dst, const void* src, size_t n) = 0;
  virtual void download(void* dst, const void* src, size_t n) = 0;
  virtual void fill(void* dst, uint8_t byte, size_t n) = 0;
  // Waits for the target's work; empty, or the error the device reported.
  virtual std::string sync() = 0;

 protected:
  fva_handle_t h_ = nullptr;
};

class HostTarget final : public Target {
 public:
  explicit HostTarget(int threads) {
    fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
    o.backend = FVA_BACKEND_CPU;
    o.cpu_threads = threads;
    if (fva_create(&h_, &o) != FVA_OK) finding(fmt::format("cannot create a CPU handle: {}", fva_last_error()));
  }
  bool is_cuda() const override { return false; }
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    return posix_memalign(&p, 64, std::max<size_t>(bytes, 1)) == 0 ? p : nullptr;
  }
  void release(void* p) override { std::free(p); }
  size_t cap() const override { return kArenaCap; }
  // Empty copies may come with null pointers, which memcpy and memset may not be given.
  void upload(void* dst, const void* src, size_t n) override {
    if (n > 0) std::memcpy(dst, src, n);
  }
  void download(void* dst, const void* src, size_t n) override {
    if (n > 0) std::memcpy(dst, src, n);
  }
  void fill(void* dst, uint8_t byte, size_t n) override {
    if (n > 0) std::memset(dst, byte, n);
  }
  std::string sync() override { return ""; }
};

// Device memory of the handle's device (tests/support/cuda_memory.h: the primary context, the one
// the library launches in); the calls run on the legacy default stream, which orders them after
// the uploads.
class CudaTarget final : public Target {
 public:
  // Null h_ with *why when there is no usable GPU.
  CudaTarget(bool portable, std::string* why) {
    fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
    o.backend = FVA_BACKEND_CUDA;
    if (portable) o.kernels = FVA_KERNELS_PORTABLE;
    if (fva_create(&h_, &o) != FVA_OK) {
      *why = fva_last_error();
      return;
    }
    fva_handle_info_t info{};
    info.struct_size = sizeof info;
    fva_get_info(h_, &info);
    describe_ = fmt::format("CUDA device {} ({}), image {}{}", info.device, info.device_name, info.image,
                            portable ? ", portable kernels" : "");
    if (std::string(info.image) == "none" || !fvt::cuda::init_memory(info.device, why)) {
      if (why->empty()) *why = fmt::format("no kernel image for {} in this build", info.device_name);
      fva_destroy(h_);
      h_ = nullptr;
    }
  }
  const std::string& describe() const { return describe_; }
  bool is_cuda() const override { return true; }
  void* alloc(size_t bytes) override {
    try {
      return fvt::cuda::alloc(std::max<size_t>(bytes, 1));
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  void release(void* p) override { fvt::cuda::release(p); }
  size_t cap() const override { return size_t{1} << 30; }
  void upload(void* dst, const void* src, size_t n) override {
    if (n) fvt::cuda::copy_to_device(dst, src, n);
  }
  void download(void* dst, const void* src, size_t n) override {
    if (n) fvt::cuda::copy_to_host(dst, src, n);
  }
  void fill(void* dst, uint8_t byte, size_t n) override {
    if (n) fvt::cuda::fill(dst, byte, n);
  }
  std::string sync() override {
    try {
      fvt::cuda::synchronize();
      return "";
    } catch (const std::exception& e) {
      return e.what();
    }
  }

 private:
  std::string describe_;
};

// Buffers of the target's memory, released at the end of a call.
class TargetBuffers {
 public:
  explicit TargetBuffers(Target& t) : t_(t) {}
  ~TargetBuffers() {
    for (void* p : owned_) t_.release(p);
  }
  void* alloc(size_t bytes) {
    void* p = t_.alloc(bytes);
    if (p == nullptr) throw std::runtime_error(fmt::format("cannot allocate {} bytes on the target", bytes));
    owned_.push_back(p);
    return p;
  }

 private:
  Target& t_;
  std::vector<void*> owned_;
};

struct Tally {
  long inputs = 0, calls = 0, compared = 0, mismatches = 0;
  std::map<std::string, long> verdicts;              // "op: verdict (status)"
  std::map<std::string, double> worst;               // op -> largest rel L2 of a compared output
};

// The workspace a call gets on one side, as the fuzz target arranges it: what the caller claims
// (ws_bytes, by the call's choice) and a buffer of at most what the query asked, poisoned.
struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};
Workspace arrange_workspace(const Call& c, size_t need, size_t cap, void* mem) {
  Workspace w;
  w.bytes = c.ws_size == 0 && need > cap ? 0 : claimed_workspace(c, need);
  w.ptr = c.ws_ptr == 1 ? nullptr : c.ws_ptr == 2 && mem ? static_cast<char*>(mem) + 8 : mem;
  return w;
}
size_t workspace_alloc(const Call& c, size_t need, size_t cap) {
  return need <= cap ? std::min(need, c.ws_size == 0 && need > cap ? 0 : claimed_workspace(c, need)) : 0;
}

// Runs one decoded tensor operation on both handles and judges them. Returns "" when they agree,
// else what differs; *summary gets a short account of the call; *fatal is set when the target's
// device reported an error (its context is unusable after that).
std::string replay_call(Kind k, ByteReader& in, fva_handle_t cpu, Target& tgt, double work_budget,
                        Tally& tally, std::string* summary, bool* fatal) {
  Call c;
  Arenas arenas;
  decode_call(k, in, cpu, &c, &arenas, work_budget);
  const char* op = op_name(k);
  const auto initial = arenas.snapshot();  // filled, before any preparation

  // ---- the CPU backend, as the fuzz target runs it
  HostMemory host;
  prepare_call(c, cpu, host, nullptr);
  const auto cpu_before = arenas.snapshot();
  const ConfigMemory cfg(c);
  StatusPair s;
  s.target_is_cuda = tgt.is_cuda();
  fva_status_t cpu_query = FVA_OK, tgt_query = FVA_OK;
  {
    fva_handle_t h = c.handle_null ? nullptr : cpu;
    if (has_query(k)) {
      size_t b = 0;
      cpu_query = query_call(c, h, cfg.p, &b);
      if (cpu_query == FVA_OK) s.cpu_need = b;
    }
    const size_t alloc = workspace_alloc(c, s.cpu_need, kArenaCap);
    void* mem = alloc ? host.alloc(alloc) : nullptr;
    if (mem) std::memset(mem, 0xCD, alloc);
    const Workspace w = arrange_workspace(c, s.cpu_need, kArenaCap, mem);
    s.cpu = invoke_call(c, h, cfg.p, w.ptr, w.bytes, nullptr);
    if (s.cpu != FVA_OK) s.cpu_message = fva_last_error();
    host.release(mem);
  }
  if (s.cpu != FVA_OK && arenas.first_changed(cpu_before, false) >= 0)
    return fmt::format("{}: the CPU backend failed ({}) but changed an argument's memory", op, s.cpu_message);

  // ---- the target, over copies of the arenas
  TargetBuffers buffers(tgt);
  const size_t n = arenas.count();
  std::vector<uint8_t*> dev(n, nullptr);
  std::vector<std::vector<uint8_t>> dev_before(n), dev_after(n);
  for (size_t j = 0; j < n; ++j) {
    if (!arenas.data(j)) continue;
    const size_t size = arenas.size(j);
    dev[j] = static_cast<uint8_t*>(buffers.alloc(size));
    std::vector<uint8_t> image = initial[j];
    const uintptr_t base = reinterpret_cast<uintptr_t>(arenas.data(j));
    const std::vector<bool> out = tensor_bytes(c, j, base, size, true);
    const std::vector<bool> in_bytes = tensor_bytes(c, j, base, size, false);
    for (size_t b = 0; b < size; ++b)
      if (out[b] && !in_bytes[b]) image[b] = 0xFF;
    tgt.upload(dev[j], image.data(), size);
  }
  Call d = c;
  for (Arg& a : d.args) {
    const size_t j = static_cast<size_t>(a.arena);
    if (a.ptr != PtrKind::kArena || !arenas.data(j)) continue;
    const uintptr_t off = reinterpret_cast<uintptr_t>(a.desc.data) - reinterpret_cast<uintptr_t>(arenas.data(j));
    a.desc.data = dev[j] + off;
  }
  prepare_call(d, tgt.handle(), tgt, nullptr);
  for (size_t j = 0; j < n; ++j) {
    if (!dev[j]) continue;
    dev_before[j].resize(arenas.size(j));
    tgt.download(dev_before[j].data(), dev[j], arenas.size(j));
  }
  {
    fva_handle_t h = d.handle_null ? nullptr : tgt.handle();
    if (has_query(k)) {
      size_t b = 0;
      tgt_query = query_call(d, h, cfg.p, &b);
      if (tgt_query == FVA_OK) s.target_need = b;
    }
    const size_t alloc = workspace_alloc(d, s.target_need, tgt.cap());
    void* mem = alloc ? buffers.alloc(alloc) : nullptr;
    if (mem) tgt.fill(mem, 0xFF, alloc);
    const Workspace w = arrange_workspace(d, s.target_need, tgt.cap(), mem);
    s.target = invoke_call(d, h, cfg.p, w.ptr, w.bytes, nullptr);
    if (s.target != FVA_OK) s.target_message = fva_last_error();
  }
  const std::string device_error = tgt.sync();
  if (!device_error.empty()) {
    *fatal = true;
    return fmt::format("{}: the device reported an error after the call ({}): {}", op,
                       fva_status_string(s.target), device_error);
  }
  for (size_t j = 0; j < n; ++j) {
    if (!dev[j]) continue;
    dev_after[j].resize(arenas.size(j));
    tgt.download(dev_after[j].data(), dev[j], arenas.size(j));
  }

  // ---- the verdict
  ++tally.calls;
  *summary = fmt::format("{} {}", op, fva_status_string(s.cpu));
  if (s.cpu != FVA_OK) *summary += fmt::format(" ({})", s.cpu_message.substr(0, 60));
  if (cpu_query != tgt_query && !(tgt.is_cuda() && tgt_query == FVA_ERR_UNSUPPORTED && cpu_query == FVA_OK))
    return fmt::format("{}: workspace query: CPU {} but target {} ({})", op, fva_status_string(cpu_query),
                       fva_status_string(tgt_query), fva_last_error());
  std::string why;
  const Verdict v = judge_status(c, s, &why);
  tally.verdicts[fmt::format("{}: {} ({} / {})", op, verdict_name(v), fva_status_string(s.cpu),
                             fva_status_string(s.target))]++;
  if (v == Verdict::kMismatch) return fmt::format("{}: {}", op, why);
  if (v != Verdict::kSame) *summary += fmt::format(" [{}: {}]", verdict_name(v), fva_status_string(s.target));
  // What the target may have changed: its outputs when it succeeded and the CPU did too.
  const bool compare = v == Verdict::kSame && s.cpu == FVA_OK;
  for (size_t j = 0; j < n; ++j) {
    if (!dev[j]) continue;
    const size_t size = arenas.size(j);
    std::vector<bool> may_change(size, false);
    if (compare) may_change = tensor_bytes(d, j, reinterpret_cast<uintptr_t>(dev[j]), size, true);
    for (size_t b = 0; b < size; ++b)
      if (!may_change[b] && dev_after[j][b] != dev_before[j][b])
        return fmt::format("{}: target {} ({}) but changed byte {} of arena {} (of {}), which {}", op,
                           fva_status_string(s.target), s.target_message, b, j, size,
                           compare ? "no output addresses" : "a failed call must leave alone");
  }
  if (!compare) return "";
  double worst = 0.0;
  for (size_t i = 0; i < c.args.size(); ++i) {
    const Arg& a = c.args[i];
    const double tol = output_tolerance(c, i);
    if (!a.is_output || a.pass_null || a.ptr != PtrKind::kArena || tol < 0) continue;
    const size_t j = static_cast<size_t>(a.arena);
    const ArenaImage ca{arenas.data(j), arenas.size(j), reinterpret_cast<uintptr_t>(arenas.data(j))};
    const ArenaImage ta{dev_after[j].data(), arenas.size(j), reinterpret_cast<uintptr_t>(dev[j])};
    const std::string diff = compare_output(c, d, i, ca, ta, tol, &worst);
    if (!diff.empty()) return fmt::format("{}: {}", op, diff);
    ++tally.compared;
  }
  tally.worst[op] = std::max(tally.worst[op], worst);
  *summary += fmt::format(" rel {:.1e}", worst);
  return "";
}

// fva_create with the input's options on this machine, fva_get_info, fva_destroy. The tail of the
// step is read where the fuzz target reads it: when fva_create succeeds there (no CUDA driver: the
// options pass their checks and do not ask for CUDA).
std::string replay_handles(ByteReader& in) {
  HandlesStep step;
  decode_handles_head(in, &step);
  const size_t bytes = std::min<size_t>(std::max<size_t>(step.o.struct_size, 4), sizeof step.o + 64);
  std::vector<uint8_t> mem(bytes, 0);
  std::memcpy(mem.data(), &step.o, std::min(bytes, sizeof step.o));
  fva_handle_t h = reinterpret_cast<fva_handle_t>(uintptr_t{0x1000});
  const fva_status_t st = fva_create(step.out_null ? nullptr : &h,
                                     step.opts_null ? nullptr : reinterpret_cast<fva_handle_options_t*>(mem.data()));
  const bool ok_without_cuda =
      st != FVA_ERR_INVALID_ARGUMENT && (step.opts_null || step.o.backend != FVA_BACKEND_CUDA);
  if (ok_without_cuda) decode_handles_tail(in, &step);
  if (st != FVA_OK) return h == nullptr || step.out_null ? "" : "fva_create failed but left *out non-NULL";
  if (ok_without_cuda) {
    const size_t ibytes = std::min<size_t>(std::max<size_t>(step.info_size, 4), sizeof(fva_handle_info_t) + 64);
    std::vector<uint8_t> info(ibytes, 0);
    std::memcpy(info.data(), &step.info_size, 4);
    (void)fva_get_info(step.info_handle_null ? nullptr : h, reinterpret_cast<fva_handle_info_t*>(info.data()));
  }
  return fva_destroy(h) == FVA_OK ? "" : "fva_destroy did not return FVA_OK";
}

// Ends the process when one input runs past its time bound (a hang, or a kernel that never ends).
class Watchdog {
 public:
  explicit Watchdog(double seconds) : limit_(seconds) {
    if (seconds > 0) thread_ = std::thread([this] { watch(); });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(m_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void start(const std::string& input) {
    std::lock_guard<std::mutex> lock(m_);
    input_ = input;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(limit_));
    armed_ = true;
  }
  void stop() {
    std::lock_guard<std::mutex> lock(m_);
    armed_ = false;
  }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(m_);
    while (!done_) {
      cv_.wait_for(lock, std::chrono::milliseconds(200));
      if (armed_ && std::chrono::steady_clock::now() > deadline_) {
        fmt::print("TIMEOUT {}: still running after {} s\n", input_, limit_);
        std::fflush(stdout);
        std::_Exit(3);
      }
    }
  }
  double limit_;
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false, armed_ = false;
  std::string input_;
  std::chrono::steady_clock::time_point deadline_;
  std::thread thread_;
};

std::vector<std::string> input_files(const std::vector<std::string>& paths) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    if (fs::is_directory(p)) {
      std::vector<std::string> dir;
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file()) dir.push_back(e.path().string());
      std::sort(dir.begin(), dir.end());
      files.insert(files.end(), dir.begin(), dir.end());
    } else if (fs::is_regular_file(p)) {
      files.push_back(p);
    } else {
      fmt::print(stderr, "fvattn_fuzz_replay: {}: no such file or directory\n", p);
      std::exit(2);
    }
  }
  return files;
}

int usage() {
  fmt::print(stderr,
             "usage: fvattn_fuzz_replay [--target cpu|cuda|auto] [--portable] [--timeout SECONDS]\n"
             "                          [--max-inputs N] [--every K] [--work-budget W] [--quiet] FILE_OR_DIR...\n"
             "  --target     the handle to replay against the CPU backend: cuda (exit 77 without a GPU),\n"
             "               cpu (a second CPU handle), auto (cuda where there is a GPU; default)\n"
             "  --portable   the CUDA handle runs the portable kernels (FVA_KERNELS_PORTABLE)\n"
             "  --timeout    per-input bound in seconds (default 120; 0: none); past it, exit 3\n"
             "  --max-inputs replay the first N inputs only; --every K: every K-th input (a sample)\n"
             "  --work-budget multiply-adds above which a call gets its last tensor NULL, as in the fuzz\n"
             "               target (default 4e6, its value: the same calls); larger runs more kernels\n"
             "  --quiet      print only failing inputs and the summary\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string target_kind = "auto";
  bool portable = false, quiet = false;
  double timeout = 120, work_budget = kWorkBudget;
  long max_inputs = -1, every = 1;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) std::exit(usage());
      return argv[++i];
    };
    try {
      if (a == "--target") target_kind = value();
      else if (a == "--portable") portable = true;
      else if (a == "--quiet") quiet = true;
      else if (a == "--timeout") timeout = std::stod(value());
      else if (a == "--work-budget") work_budget = std::stod(value());
      else if (a == "--max-inputs") max_inputs = std::stol(value());
      else if (a == "--every") every = std::max(1L, std::stol(value()));
      else if (a == "--help" || a == "-h") return usage(), 0;
      else if (!a.empty() && a[0] == '-') return usage();
      else paths.push_back(a);
    } catch (const std::exception&) {
      return usage();
    }
  }
  if (paths.empty() || (target_kind != "cpu" && target_kind != "cuda" && target_kind != "auto")) return usage();

  fva_handle_t cpu = nullptr;
  fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = FVA_BACKEND_CPU;
  o.cpu_threads = 2;  // as the fuzz target's
  if (fva_create(&cpu, &o) != FVA_OK) finding(fmt::format("cannot create a CPU handle: {}", fva_last_error()));

  std::unique_ptr<Target> target;
  std::string describe = "a second CPU handle (1 thread)";
  if (target_kind != "cpu") {
    std::string why;
    auto cuda = std::make_unique<CudaTarget>(portable, &why);
    if (cuda->handle() != nullptr) {
      describe = cuda->describe();
      target = std::move(cuda);
    } else if (target_kind == "cuda") {
      fmt::print("SKIPPED: no usable GPU to replay against: {}\n", why);
      return 77;
    } else {
      describe += fmt::format(" (no GPU: {})", why);
    }
  }
  if (!target) target = std::make_unique<HostTarget>(1);

  std::vector<std::string> files = input_files(paths);
  std::vector<std::string> picked;
  for (size_t i = 0; i < files.size(); i += static_cast<size_t>(every)) picked.push_back(files[i]);
  if (max_inputs >= 0 && picked.size() > static_cast<size_t>(max_inputs)) picked.resize(static_cast<size_t>(max_inputs));
  fmt::print("fvattn_fuzz_replay: {} inputs, CPU backend against {}\n", picked.size(), describe);
  std::fflush(stdout);

  Tally tally;
  Watchdog watchdog(timeout);
  std::vector<std::string> failed;
  bool fatal = false;
  for (const std::string& file : picked) {
    std::ifstream f(file, std::ios::binary);
    const std::vector<uint8_t> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const auto t0 = std::chrono::steady_clock::now();
    watchdog.start(file);
    ByteReader in(data.data(), data.size());
    std::vector<std::string> calls;
    std::string problem;
    for (int steps = 0; steps < kMaxSteps && problem.empty() && !fatal; ++steps) {
      const Kind k = read_kind(in);
      if (k == Kind::kHandles) {
        problem = replay_handles(in);
        calls.push_back("fva_create");
      } else if (k == Kind::kMisc) {
        MiscStep m;
        decode_misc(in, &m);
      } else if (k == Kind::kTilePlan) {
        TilePlanStep t;
        decode_tile_plan(in, &t);
      } else {
        std::string summary;
        try {
          problem = replay_call(k, in, cpu, *target, work_budget, tally, &summary, &fatal);
        } catch (const std::exception& e) {
          problem = fmt::format("{}: {}", op_name(k), e.what());
          fatal = target->is_cuda();  // a failed copy or allocation: the device is in doubt
        }
        calls.push_back(summary.empty() ? op_name(k) : summary);
      }
      if (in.empty()) break;
    }
    watchdog.stop();
    ++tally.inputs;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::string list;
    for (const std::string& c : calls) list += (list.empty() ? "" : "; ") + c;
    if (!problem.empty()) {
      ++tally.mismatches;
      failed.push_back(file);
      fmt::print("FAIL {} ({:.0f} ms): {}\n     calls: {}\n", file, ms, problem, list);
    } else if (!quiet) {
      fmt::print("ok   {} ({:.0f} ms): {}\n", file, ms, list);
    }
    std::fflush(stdout);
    if (fatal) {
      fmt::print("stopping: the target's device reported an error, later inputs cannot run on it\n");
      break;
    }
  }

  fmt::print("\nsummary: {} inputs, {} tensor calls, {} outputs compared, {} failing inputs\n", tally.inputs,
             tally.calls, tally.compared, tally.mismatches);
  for (const auto& [what, count] : tally.verdicts) fmt::print("  {:<72} {:>6}\n", what, count);
  for (const auto& [op, e] : tally.worst) fmt::print("  largest rel L2 of {:<40} {:.2e}\n", op, e);
  for (const std::string& f : failed) fmt::print("  failing: {}\n", f);
  fva_destroy(cpu);
  target.reset();
  return tally.mismatches || fatal ? 1 : 0;
}
