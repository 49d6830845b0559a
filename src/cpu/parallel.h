// parallel_for over independent work items (the CPU backend's (batch, head) units).
#pragma once

#include <cstdint>
#include <functional>

namespace fva::cpu {

// Runs body(i) for i in [0, n) on up to `threads` threads (the calling thread is one of them) and
// returns when all are done. Items are handed out dynamically. If a body throws, the remaining items
// are abandoned and the first exception is rethrown in the caller.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& body);

// The worker count a CPU handle uses: FVATTN_NUM_THREADS when set to a positive integer, else the
// hardware concurrency (at least 1).
int default_thread_count();

}  // namespace fva::cpu
