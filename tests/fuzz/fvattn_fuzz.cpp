// libFuzzer target over every entry point of the public API: it decodes the input into calls
// (fuzz_call.h: a valid small problem, then up to eight mutations: ranks, dtypes, shapes and strides
// near the 64-bit limits, NULL and odd pointers, aliasing, config fields, workspace pointers and
// sizes), runs each call on the CPU backend over real, exactly sized buffers
// (memory_model.h says which pointers it may pass), and checks the contract of fvattn.h:
//   - no crash, no sanitizer report, no hang (work per call is bounded, see kWorkBudget);
//   - the status is a known one, and a failure leaves a message in fva_last_error();
//   - a failing call writes nothing at all; a workspace query touches no tensor memory and leaves
//     *bytes alone when it fails; a successful call writes no arena that holds only inputs;
//   - a call whose workspace query fails (same handle, config and shared tensors) fails too.
// Any violation aborts, which libFuzzer reports as a crash with the input that caused it.
#include <fmt/format.h>
#include <fvattn/fvattn.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "byte_reader.h"
#include "fuzz_call.h"
#include "memory_model.h"

namespace fvafuzz {

void finding(const std::string& what) {
  fmt::print(stderr, "\nfvattn_fuzz: contract violated: {}\n", what);
  std::abort();
}

namespace {

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

// ---- running a call -------------------------------------------------------------------------------

// Decodes one tensor operation of kind k, runs it on the CPU handle and checks the contract.
void run(Kind k, ByteReader& in) {
  Call c;
  Arenas arenas;
  decode_call(k, in, g_cpu, &c, &arenas);
  const char* op = op_name(k);
  HostMemory host;
  prepare_call(c, g_cpu, host, nullptr);
  const auto before = arenas.snapshot();
  const ConfigMemory cfg(c);
  fva_handle_t h = c.handle_null ? nullptr : g_cpu;

  fva_status_t qst = FVA_OK;
  size_t need = 0;
  if (has_query(k)) {
    constexpr size_t kUntouched = 0x5eed5eed;
    size_t bytes = kUntouched;
    qst = query_call(c, h, cfg.p, &bytes);
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
  const size_t ws_bytes = c.ws_size == 0 && need > kArenaCap ? 0 : claimed_workspace(c, need);
  const size_t ws_alloc = need <= kArenaCap ? std::min(need, ws_bytes) : 0;
  void* ws_mem = nullptr;
  if (ws_alloc > 0 && posix_memalign(&ws_mem, 64, ws_alloc) != 0) std::abort();
  if (ws_mem) std::memset(ws_mem, 0xCD, ws_alloc);
  void* ws = c.ws_ptr == 1 ? nullptr
             : c.ws_ptr == 2 && ws_mem ? static_cast<char*>(ws_mem) + 8
                                        : ws_mem;

  const fva_status_t st = invoke_call(c, h, cfg.p, ws, ws_bytes, nullptr);
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
    if (c.budget_nulled)
      finding(fmt::format("{} succeeded with {} = NULL", op, c.args[c.budget_null].name));
    const int changed = arenas.first_changed(before, true);
    if (changed >= 0)
      finding(fmt::format("{} wrote into the buffer of input {}", op, c.args[static_cast<size_t>(changed)].name));
  }
}

// fva_vsa_tile_plan: grids from small to absurd, tiles from 1 to absurd, each pointer NULL or not.
// Outputs are allocated exactly once the count is known (small grids only): a success must write
// a valid plan, a failure nothing.
void tile_plan(ByteReader& in) {
  TilePlanStep step;
  decode_tile_plan(in, &step);
  const int64_t* dims = step.dims;
  const int32_t* tile = step.tile;
  const uint8_t nulls = step.nulls;
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

// fva_create with arbitrary options (the options struct exactly as large as struct_size says),
// fva_get_info on what it made, fva_destroy.
void handles(ByteReader& in) {
  HandlesStep step;
  decode_handles_head(in, &step);
  const fva_handle_options_t& o = step.o;
  const bool opts_null = step.opts_null, out_null = step.out_null;
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
  decode_handles_tail(in, &step);
  const uint32_t info_size = step.info_size;
  // Exactly as large as struct_size says (within reason): writing more is an out-of-bounds write.
  const size_t ibytes = std::min<size_t>(std::max<size_t>(info_size, 4), sizeof(fva_handle_info_t) + 64);
  void* info_mem = std::calloc(1, ibytes);
  std::memcpy(info_mem, &info_size, 4);
  auto* info = static_cast<fva_handle_info_t*>(info_mem);
  const fva_status_t ist = fva_get_info(step.info_handle_null ? nullptr : h, info);
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
  MiscStep step;
  decode_misc(in, &step);
  const int32_t s = step.status;
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

// An input is a sequence of steps (at most eight), each a kind byte and what it reads (fuzz_call.h).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fvafuzz;
  ByteReader in(data, size);
  for (int steps = 0; steps < kMaxSteps; ++steps) {
    const Kind k = read_kind(in);
    switch (k) {
      case Kind::kHandles: handles(in); break;
      case Kind::kMisc: misc(in); break;
      case Kind::kTilePlan: tile_plan(in); break;
      default: run(k, in); break;
    }
    if (in.empty()) break;
  }
  return 0;
}
