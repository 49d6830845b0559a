// parallel_for over independent work items (the CPU backend's (batch, head) units).
#pragma once

#include <cstdint>
#include <functional>

namespace fva::cpu {

// Runs body(i) for i in [0, n) on up to `threads` threads (the calling thread is one of them) and
// returns when all are done. Items are handed out dynamically. If a body throws, the remaining items
// are abandoned and the first exception is rethrown in the caller.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& body);

}  // namespace fva::cpu
