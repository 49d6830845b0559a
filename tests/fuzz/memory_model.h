// How the fuzzer hands memory to fvattn. The library cannot know how large the caller's buffers
// are, so the fuzzer may only pass a data pointer that either
//   - points into a real allocation (an "arena") that covers every byte the descriptor addresses, or
//   - breaks a rule the header documents for that tensor alone (NULL, not 16-byte aligned, a byte
//     range that wraps the address space, a bad rank/dtype/shape/stride, more than 2^56 elements),
//     so that the call must fail before touching memory.
// Arenas are sized exactly (posix_memalign), so AddressSanitizer reports any access past what a
// descriptor addresses, and several tensors may share one arena (aliasing, packed layouts).
#pragma once

#include <fvattn/fvattn.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace fvafuzz {

// Bytes [0, E) that t addresses from t.data when t obeys the tensor rules of fvattn.h that hold for
// every argument (rank 1..6, a known dtype, shape >= 1, strides >= 0, last stride 1, at most 2^56
// elements, largest offset within int64); nullopt when it breaks one of them.
std::optional<uint64_t> addressed_bytes(const fva_tensor_t& t);

// The product of the first `rank` (at most 4) extents of t, each clamped to >= 1, saturating at
// 2^62: what an operation's work grows with, whether or not t is valid.
double extent_product(const fva_tensor_t& t, int rank);

enum class PtrKind {
  kArena,  // into the tensor's arena, at its offset (the default)
  kNull,   // NULL data
  kOdd,    // a misaligned address outside any allocation
  kTop,    // an aligned address `top_gap` bytes below 2^64 (its byte range must wrap)
};

// A tensor argument of one call, as the fuzzer arranges it.
struct Arg {
  const char* name = "";
  bool is_output = false;
  bool pass_null = false;  // pass a NULL descriptor pointer
  fva_tensor_t desc{};     // data is filled in by Arena::place
  int arena = 0;           // index into the arenas
  uint64_t offset = 0;     // bytes into the arena
  PtrKind ptr = PtrKind::kArena;
  uint64_t odd = 1;        // kOdd: the misalignment, 1..15
  uint64_t top_gap = 16;   // kTop: distance below 2^64, a multiple of 16

  const fva_tensor_t* arg() const { return pass_null ? nullptr : &desc; }
};

// Largest arena the fuzzer allocates; a tensor that would need more is handed an invalid pointer.
constexpr uint64_t kArenaCap = uint64_t{1} << 22;

// The arenas of one call.
class Arenas {
 public:
  // Sizes and allocates arenas for `args` (arena indices are taken modulo args.size()) and sets
  // every descriptor's data pointer by the rules above. A tensor whose pointer kind cannot be
  // honoured safely gets NULL instead.
  void place(std::vector<Arg>& args);
  ~Arenas();

  size_t count() const { return mem_.size(); }
  uint8_t* data(size_t i) const { return mem_[i]; }
  size_t size(size_t i) const { return size_[i]; }
  // The arena holds at least one output tensor (or a pointer into it that is not an input's).
  bool holds_output(size_t i) const { return has_output_[i]; }

  // Copies of every arena's bytes, to prove a call wrote nothing (or only to outputs).
  std::vector<std::vector<uint8_t>> snapshot() const;
  // The first arena (index) whose bytes differ from the snapshot, considering only arenas that
  // hold no output when `inputs_only`; -1 when none differs.
  int first_changed(const std::vector<std::vector<uint8_t>>& before, bool inputs_only) const;

 private:
  std::vector<uint8_t*> mem_;
  std::vector<size_t> size_;
  std::vector<bool> has_output_;
};

}  // namespace fvafuzz
