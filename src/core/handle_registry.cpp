#include "core/handle_registry.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_set>

namespace fva {
namespace {

// An open-addressing table of live handles' addresses, read without a lock: a slot is 0 (never
// used: a lookup stops there), 1 (a destroyed handle's: lookups go on past it, a new handle may
// take it) or a live handle's address. Slots change by compare-and-swap only. A process that keeps
// more live handles than the table holds puts the rest in a mutex-guarded overflow set, which
// lookups consult only while it is not empty.
constexpr size_t kSlots = 4096;  // a power of two
constexpr uintptr_t kEmpty = 0, kTombstone = 1;

struct Registry {
  std::atomic<uintptr_t> slots[kSlots] = {};
  std::atomic<size_t> overflow_size{0};
  std::mutex overflow_mutex;
  std::unordered_set<const fva_handle*> overflow;
};

// Never destroyed: handles may be checked from static destructors of other libraries.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

size_t first_slot(uintptr_t p) {
  return static_cast<size_t>(((p >> 4) * 0x9E3779B97F4A7C15ull) >> 52) & (kSlots - 1);
}

}  // namespace

void register_handle(const fva_handle* h) {
  Registry& r = registry();
  const uintptr_t p = reinterpret_cast<uintptr_t>(h);
  for (size_t i = 0, s = first_slot(p); i < kSlots; ++i, s = (s + 1) & (kSlots - 1)) {
    uintptr_t cur = r.slots[s].load(std::memory_order_relaxed);
    while (cur == kEmpty || cur == kTombstone) {
      if (r.slots[s].compare_exchange_weak(cur, p, std::memory_order_release, std::memory_order_relaxed))
        return;
    }
  }
  std::lock_guard<std::mutex> lock(r.overflow_mutex);
  r.overflow.insert(h);
  r.overflow_size.store(r.overflow.size(), std::memory_order_release);
}

bool unregister_handle(const fva_handle* h) {
  Registry& r = registry();
  const uintptr_t p = reinterpret_cast<uintptr_t>(h);
  for (size_t i = 0, s = first_slot(p); i < kSlots; ++i, s = (s + 1) & (kSlots - 1)) {
    uintptr_t cur = r.slots[s].load(std::memory_order_acquire);
    if (cur == kEmpty) break;
    // Of two threads destroying one handle, one swaps it out; the other then finds it gone.
    if (cur == p && r.slots[s].compare_exchange_strong(cur, kTombstone, std::memory_order_acq_rel))
      return true;
  }
  if (r.overflow_size.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> lock(r.overflow_mutex);
  const bool erased = r.overflow.erase(h) == 1;
  r.overflow_size.store(r.overflow.size(), std::memory_order_release);
  return erased;
}

bool is_live_handle(const fva_handle* h) {
  Registry& r = registry();
  const uintptr_t p = reinterpret_cast<uintptr_t>(h);
  for (size_t i = 0, s = first_slot(p); i < kSlots; ++i, s = (s + 1) & (kSlots - 1)) {
    const uintptr_t cur = r.slots[s].load(std::memory_order_acquire);
    if (cur == p) return true;
    if (cur == kEmpty) break;
  }
  if (r.overflow_size.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> lock(r.overflow_mutex);
  return r.overflow.count(h) == 1;
}

}  // namespace fva
