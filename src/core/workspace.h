// How every operation lays out the caller's workspace: regions start on 64-byte boundaries (one
// cache line) from a base aligned up from ws, because the API only promises 16-byte alignment;
// every workspace size therefore includes kWorkspaceBasePad bytes for that. A WorkspaceLayout is
// computed once per call plan (without a pointer) and gives both the size the query reports and,
// bound to the caller's pointer, the regions the call uses: the two cannot disagree.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fva {

constexpr size_t kWorkspaceAlign = 64;
constexpr size_t kWorkspaceBasePad = kWorkspaceAlign;

// bytes rounded up to a whole number of 64-byte lines: the size of one region.
inline size_t workspace_round_up(size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// The first 64-byte boundary at or after ws: where the first region starts.
inline char* workspace_base(void* ws) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(ws);
  return static_cast<char*>(ws) + ((kWorkspaceAlign - u % kWorkspaceAlign) % kWorkspaceAlign);
}

// One region of a layout: absent (the plan needs no such buffer) or an offset from the base.
struct WorkspaceRegion {
  bool present = false;
  size_t offset = 0;
  size_t bytes = 0;
};

// Regions appended in order, each on a 64-byte boundary.
class WorkspaceLayout {
 public:
  template <typename T>
  WorkspaceRegion add(size_t count) {
    WorkspaceRegion r{true, used_, count * sizeof(T)};
    used_ += workspace_round_up(r.bytes);
    return r;
  }
  // Bytes the caller must provide (with the alignment pad; 0 when there is no region).
  size_t bytes() const { return used_ ? used_ + kWorkspaceBasePad : 0; }

 private:
  size_t used_ = 0;
};

// Where `r` lies in the caller's workspace `ws`; null for an absent region.
template <typename T>
T* workspace_pointer(void* ws, const WorkspaceRegion& r) {
  return r.present ? reinterpret_cast<T*>(workspace_base(ws) + r.offset) : nullptr;
}

}  // namespace fva
