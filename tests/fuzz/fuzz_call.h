// The fuzz input format, decoded: bytes -> the calls an input makes. One decoder serves the
// libFuzzer target (fvattn_fuzz.cpp, CPU backend) and the replay (fvattn_fuzz_replay.cpp, which runs
// each decoded call on the CPU backend and again on a CUDA handle), so an input means the same calls
// to both.
//
// An input is a sequence of at most eight steps, each a kind byte (read_kind) and what that kind
// reads. A tensor operation (decode_call) is a valid small problem, up to eight mutations of its
// descriptors, config and workspace choices, its arenas placed (memory_model.h) and filled from the
// input, in that order; the host-only kinds (handles, misc, tile_plan) read their own bytes.
#pragma once

#include <fvattn/fvattn.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "byte_reader.h"
#include "memory_model.h"

namespace fvafuzz {

// Reports a broken contract (or a decoder invariant) with the input that caused it. Each program
// that links the decoder defines it: the fuzz target aborts (libFuzzer keeps the input), the replay
// exits non-zero.
[[noreturn]] void finding(const std::string& what);

// Upper bound on the multiply-adds one call may do: a few milliseconds under ASan. A problem above
// it is still checked, but its budget argument is passed as NULL so that the call must fail (a NULL
// tensor is always rejected) after checking everything before it.
constexpr double kWorkBudget = 4.0e6;

// The kinds of step, numbered as the input's kind byte selects them (tests/fuzz/make_corpus.py
// writes the same numbers).
enum class Kind {
  kQatForward = 0,
  kQatBackward,
  kVsaForward,
  kVsaBackward,
  kInvert,
  kNvfp4,
  kHandles,
  kMisc,
  kLayerForward,
  kLayerBackward,
  kTilePlan,
};
constexpr int kKinds = 11;
constexpr int kMaxSteps = 8;

Kind read_kind(ByteReader& in);
// The tensor operations: every kind but handles, misc and tile_plan.
bool is_tensor_op(Kind k);
// The public function a tensor operation calls ("fva_qat_forward"), a static string.
const char* op_name(Kind k);

// How an argument's arena is filled when it owns the arena (the first argument placed in it).
enum class Fill { kAttnIn, kOutput, kLseIn, kIndex, kCount, kBlockSizes };

struct Dims {
  int32_t dtype = FVA_DTYPE_BF16;
  bool bshd = false;
  int64_t pad = 0;
  int64_t B = 1, Hq = 1, Hkv = 1, Sq = 1, Skv = 1, D = 16;
  int64_t num_kv_blocks = 1, max_k = 1;  // VSA and index inversion
};

// One tensor operation: its tensor arguments (with how to fill each), its config as raw bytes
// (every config field is 4 bytes wide, struct_size first), and the handle and workspace choices.
struct Call {
  Kind kind = Kind::kQatForward;
  std::vector<Arg> args;
  std::vector<Fill> fills;
  std::vector<uint8_t> cfg;  // empty: the operation takes no config
  bool cfg_null = false;
  bool handle_null = false;
  int ws_ptr = 0;            // 0 the queried buffer, 1 NULL, 2 misaligned by 8 bytes
  int ws_size = 0;           // 0 the queried size, 1 one byte less, 2 zero, 3 SIZE_MAX, 4 more
                             // (by ws_extra), 5 half
  uint8_t ws_extra = 0;      // ws_size 4: bytes beyond the query's
  size_t budget_null = 0;    // the argument passed as NULL when the work is over budget
  bool budget_nulled = false;
  int reserve_arg = -1;      // the VSA layer's reserve: an I32 [bytes / 4] argument passed as void*
  int reserve_size = 0;      // its reserve_bytes: 0 all its arena holds from its pointer, 1 one byte
                             // less, 2 half, 3 zero (never more: the caller's word is the bound)
  int prepare_mode = -1;     // layer backward: how its reserve is filled before the call (0 the
                             // same forward, 1 none, 2 the gate toggled, 3 another topk); -1 none
  Dims dims;

  void add(const char* name, const fva_tensor_t& t, Fill fill);
  template <typename Config>
  void set_config(const Config& c) {
    cfg.resize(sizeof c);
    std::memcpy(cfg.data(), &c, sizeof c);
  }
  const fva_tensor_t* t(size_t i) const { return args[i].arg(); }
};

// Decodes a tensor operation of kind k (is_tensor_op(k)): builds the problem, mutates it, places
// its arenas into `arenas` and fills them, and reads the workspace's extra byte. `sizes` is a CPU
// handle: the VSA layer's reserve is sized by its fva_vsa_layer_sizes (the same on every backend).
// A call whose work exceeds work_budget gets its budget argument NULL (the fuzz target's calls use
// kWorkBudget; the replay may lift it to run the kernels on the larger problems too).
void decode_call(Kind k, ByteReader& in, fva_handle_t sizes, Call* c, Arenas* arenas,
                 double work_budget = kWorkBudget);

// The call's work (multiply-adds, roughly) from its descriptors: shapes only, valid or not.
double call_work(const Call& c);

// Whether the operation has a workspace query (every one but NVFP4 quantization does).
bool has_query(Kind k);
// The operation's workspace query and the operation itself, on handle h with config memory cfg
// (ConfigMemory below), the call's descriptors as they are (their data pointers included).
fva_status_t query_call(const Call& c, fva_handle_t h, const void* cfg, size_t* bytes);
fva_status_t invoke_call(const Call& c, fva_handle_t h, const void* cfg, void* ws, size_t ws_bytes,
                         void* stream);

// The workspace bytes the caller claims for a query's answer `need`, by the call's ws_size choice.
size_t claimed_workspace(const Call& c, size_t need);

// The reserve of a VSA layer call: its pointer (NULL for a NULL descriptor) and the bytes the
// caller claims, at most what its arena holds from that pointer.
void* reserve_ptr(const Call& c);
size_t reserve_bytes(const Call& c);

// Memory of one backend's kind for what an operation prepares before its call: host memory for
// the CPU backend, device memory for a CUDA handle.
class Memory {
 public:
  virtual ~Memory() = default;
  virtual void* alloc(size_t bytes) = 0;  // null on failure
  virtual void release(void* p) = 0;
  virtual size_t cap() const = 0;         // the largest buffer the preparation may ask for
};

// Host memory for a preparation on the CPU backend, as large as an arena at most.
class HostMemory final : public Memory {
 public:
  void* alloc(size_t bytes) override;
  void release(void* p) override;
  size_t cap() const override { return kArenaCap; }
};

// What an operation does to its arenas before the call under test, on handle h (part of the
// arrangement, so before the snapshot): the VSA layer's backward runs a forward over the call's
// own arguments to fill its reserve, by prepare_mode. A no-op for every other operation.
void prepare_call(const Call& c, fva_handle_t h, Memory& mem, void* stream);

// The config as the caller's memory: exactly struct_size bytes (within reason), so reading past
// what the caller said it has is an out-of-bounds read. p is null for a NULL config.
struct ConfigMemory {
  void* p = nullptr;
  explicit ConfigMemory(const Call& c);
  ~ConfigMemory();
  ConfigMemory(const ConfigMemory&) = delete;
  ConfigMemory& operator=(const ConfigMemory&) = delete;
};

// ---- the host-only kinds ---------------------------------------------------------------------------

// fva_create with arbitrary options. The head is read before fva_create; the tail (fva_get_info's
// arguments) only when fva_create succeeded in the fuzz target's environment (a CPU handle, no CUDA
// driver).
struct HandlesStep {
  fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
  bool opts_null = false, out_null = false;
  uint32_t info_size = sizeof(fva_handle_info_t);
  bool info_handle_null = false;
};
void decode_handles_head(ByteReader& in, HandlesStep* s);
void decode_handles_tail(ByteReader& in, HandlesStep* s);

struct MiscStep {
  int32_t status = 0;  // fva_status_string's argument
};
void decode_misc(ByteReader& in, MiscStep* s);

struct TilePlanStep {
  int64_t dims[3];
  int32_t tile[3];
  uint8_t nulls = 0;  // bit 0: dims NULL, bit 1: tile NULL
};
void decode_tile_plan(ByteReader& in, TilePlanStep* s);

}  // namespace fvafuzz
