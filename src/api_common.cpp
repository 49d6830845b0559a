// Version queries, status names and the thread-local last-error message.
#include <string>

#include "error.h"
#include "fvattn/fvattn.h"

namespace fva {
namespace {
thread_local std::string t_last_error;
}

fva_status_t set_last_error(fva_status_t status, std::string message) {
  t_last_error = std::move(message);
  return status;
}

}  // namespace fva

extern "C" {

int32_t fva_version(void) {
  return FVA_VERSION_MAJOR * 10000 + FVA_VERSION_MINOR * 100 + FVA_VERSION_PATCH;
}

int32_t fva_abi_version(void) { return FVA_ABI_VERSION; }

const char* fva_status_string(fva_status_t status) {
  switch (status) {
    case FVA_OK: return "FVA_OK";
    case FVA_ERR_INVALID_ARGUMENT: return "FVA_ERR_INVALID_ARGUMENT";
    case FVA_ERR_UNSUPPORTED: return "FVA_ERR_UNSUPPORTED";
    case FVA_ERR_WORKSPACE_TOO_SMALL: return "FVA_ERR_WORKSPACE_TOO_SMALL";
    case FVA_ERR_NO_DEVICE: return "FVA_ERR_NO_DEVICE";
    case FVA_ERR_CUDA: return "FVA_ERR_CUDA";
    case FVA_ERR_OUT_OF_MEMORY: return "FVA_ERR_OUT_OF_MEMORY";
    case FVA_ERR_INTERNAL: return "FVA_ERR_INTERNAL";
    default: return "unknown status";
  }
}

const char* fva_last_error(void) {
  try {
    return fva::t_last_error.c_str();
  } catch (...) {
    return "";
  }
}

}  // extern "C"
