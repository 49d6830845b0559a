// How the CPU operations lay out the caller's workspace: sub-buffers start on 64-byte boundaries
// (one cache line) from a base aligned up from ws, because the API only promises 16-byte alignment;
// every workspace size therefore includes kWorkspaceBasePad bytes for that.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fva::cpu {

constexpr size_t kWorkspaceAlign = 64;
constexpr size_t kWorkspaceBasePad = kWorkspaceAlign;

// bytes rounded up to a whole number of 64-byte lines: the size of one sub-buffer.
inline size_t workspace_round_up(size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// The first 64-byte boundary at or after ws: where the first sub-buffer starts.
inline char* workspace_base(void* ws) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(ws);
  return static_cast<char*>(ws) + ((kWorkspaceAlign - u % kWorkspaceAlign) % kWorkspaceAlign);
}

}  // namespace fva::cpu
