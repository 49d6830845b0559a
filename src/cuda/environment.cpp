#include "environment.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "error.h"

namespace fva::cuda {

int64_t env_whole_number(const char* name, int64_t fallback, int64_t max, const char* expected) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(env, &end, 10);
  if (errno != 0 || end == env || *end != '\0' || v < 0 || v > max)
    fail(FVA_ERR_INVALID_ARGUMENT, "{}='{}': expected {}", name, env, expected);
  return v;
}

bool env_switch_on(const char* name) {
  const char* env = std::getenv(name);
  if (env != nullptr && std::string(env) == "auto") return true;
  return env_whole_number(name, 1, 1, "auto, 0 or 1") != 0;
}

}  // namespace fva::cuda
