// How failures travel inside the library: check code throws fva::Failure (a status and a message);
// every public entry point runs its body through fva::guard(), which turns that, std::bad_alloc and
// anything unexpected into a status and the thread-local message. No exception crosses the C ABI.
#pragma once

#include <fmt/format.h>

#include <string>
#include <utility>

#include "fvattn/fvattn.h"

namespace fva {

struct Failure {
  fva_status_t status;
  std::string message;
};

template <typename... Args>
[[noreturn]] void fail(fva_status_t status, fmt::format_string<Args...> format, Args&&... args) {
  throw Failure{status, fmt::format(format, std::forward<Args>(args)...)};
}

// Records `message` as this thread's last error and returns `status`.
fva_status_t set_last_error(fva_status_t status, std::string message);

template <typename Body>
fva_status_t guard(Body&& body) noexcept {
  try {
    body();
    return FVA_OK;
  } catch (const Failure& f) {
    return set_last_error(f.status, f.message);
  } catch (const std::bad_alloc&) {
    return set_last_error(FVA_ERR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return set_last_error(FVA_ERR_INTERNAL, fmt::format("internal error: {}", e.what()));
  } catch (...) {
    return set_last_error(FVA_ERR_INTERNAL, "internal error: unknown exception");
  }
}

}  // namespace fva
