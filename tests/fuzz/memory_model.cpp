#include "memory_model.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "tensor_desc.h"

namespace fvafuzz {
namespace {

using u128 = unsigned __int128;

// Below mmap_min_addr on Linux: never mapped, so a stray access faults instead of passing silently.
constexpr uintptr_t kOddBase = 0x1000;

}  // namespace

std::optional<uint64_t> addressed_bytes(const fva_tensor_t& t) {
  if (t.rank < 1 || t.rank > FVA_MAX_RANK) return std::nullopt;
  const uint64_t es = fvadesc::dtype_size(t.dtype);
  if (es == 0) return std::nullopt;  // not a dtype fvattn.h defines
  if (t.strides[t.rank - 1] != 1) return std::nullopt;
  u128 numel = 1, last = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 1 || t.strides[i] < 0) return std::nullopt;
    numel *= static_cast<u128>(t.shape[i]);
    if (numel > (u128{1} << 56)) return std::nullopt;
    last += static_cast<u128>(t.shape[i] - 1) * static_cast<u128>(t.strides[i]);
    if (last > static_cast<u128>(INT64_MAX)) return std::nullopt;
  }
  const u128 bytes = (last + 1) * es;
  if (bytes > static_cast<u128>(INT64_MAX)) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

double extent_product(const fva_tensor_t& t, int rank) {
  double p = 1.0;
  for (int i = 0; i < std::min(rank, 4); ++i)
    p *= static_cast<double>(std::max<int64_t>(t.shape[i], 1));
  return std::min(p, 4.6e18);
}

void Arenas::place(std::vector<Arg>& args) {
  const size_t n = args.size();
  std::vector<std::optional<uint64_t>> extent(n);
  std::vector<uint64_t> need(n, 0);
  for (size_t i = 0; i < n; ++i) {
    Arg& a = args[i];
    a.arena = static_cast<int>(static_cast<size_t>(a.arena) % n);
    extent[i] = addressed_bytes(a.desc);
    // An aligned pointer near 2^64 is safe only when the byte range provably wraps.
    if (a.ptr == PtrKind::kTop && extent[i] && *extent[i] <= a.top_gap) a.ptr = PtrKind::kNull;
    if (a.ptr == PtrKind::kArena && extent[i]) {
      const u128 end = static_cast<u128>(a.offset) + *extent[i];
      const uint64_t e = end > kArenaCap ? kArenaCap + 1 : static_cast<uint64_t>(end);
      need[static_cast<size_t>(a.arena)] = std::max(need[static_cast<size_t>(a.arena)], e);
    }
  }
  mem_.assign(n, nullptr);
  size_.assign(n, 0);
  has_output_.assign(n, false);
  for (size_t j = 0; j < n; ++j) {
    if (need[j] > kArenaCap) continue;  // too large: its tensors get invalid pointers below
    void* p = nullptr;
    // Exactly need[j] bytes (at least one), so the sanitizer's redzone starts right after them.
    if (posix_memalign(&p, 64, std::max<uint64_t>(need[j], 1)) != 0) std::abort();
    mem_[j] = static_cast<uint8_t*>(p);
    size_[j] = need[j];
  }
  for (size_t i = 0; i < n; ++i) {
    Arg& a = args[i];
    const size_t j = static_cast<size_t>(a.arena);
    if (a.ptr == PtrKind::kArena && mem_[j] == nullptr) a.ptr = PtrKind::kOdd;
    uintptr_t p = 0;
    switch (a.ptr) {
      case PtrKind::kArena: p = reinterpret_cast<uintptr_t>(mem_[j]) + a.offset; break;
      case PtrKind::kNull: p = 0; break;
      case PtrKind::kOdd: p = kOddBase + 1 + (a.odd - 1) % 15; break;
      case PtrKind::kTop: p = uintptr_t{0} - a.top_gap; break;
    }
    a.desc.data = reinterpret_cast<void*>(p);
    if (a.is_output && !a.pass_null && a.ptr == PtrKind::kArena) has_output_[j] = true;
  }
}

Arenas::~Arenas() {
  for (uint8_t* p : mem_) std::free(p);
}

std::vector<std::vector<uint8_t>> Arenas::snapshot() const {
  std::vector<std::vector<uint8_t>> s(mem_.size());
  for (size_t i = 0; i < mem_.size(); ++i)
    if (mem_[i]) s[i].assign(mem_[i], mem_[i] + size_[i]);
  return s;
}

int Arenas::first_changed(const std::vector<std::vector<uint8_t>>& before, bool inputs_only) const {
  for (size_t i = 0; i < mem_.size(); ++i) {
    if (!mem_[i] || (inputs_only && has_output_[i])) continue;
    if (size_[i] && std::memcmp(mem_[i], before[i].data(), size_[i]) != 0) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace fvafuzz
