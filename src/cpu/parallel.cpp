#include "parallel.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace fva::cpu {

void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& body) {
  if (n <= 0) return;
  const int workers = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first_error;
  std::mutex error_mutex;

  auto run = [&] {
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) return;
      try {
        body(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
        failed.store(true);
        return;
      }
    }
  };

  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(workers - 1));
  try {
    for (int t = 1; t < workers; ++t) pool.emplace_back(run);
  } catch (...) {
    // Could not start more threads: the ones running (and this one) still finish the work.
  }
  run();
  for (auto& th : pool) th.join();
  if (first_error) std::rethrow_exception(first_error);
}


}  // namespace fva::cpu
