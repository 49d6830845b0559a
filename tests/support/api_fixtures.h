// Small fixtures every API test uses: a CPU handle, a poisoned workspace, REQUIRE_OK.
#pragma once

#include <doctest/doctest.h>
#include <fvattn/fvattn.h>

#include <cstring>
#include <string>

#include "support/host_tensor.h"

namespace fvt {

// A CPU-backend handle for the duration of a test.
struct CpuHandle {
  fva_handle_t h = nullptr;
  CpuHandle() {
    fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
    o.backend = FVA_BACKEND_CPU;
    const fva_status_t st = fva_create(&h, &o);
    REQUIRE_MESSAGE(st == FVA_OK, "fva_create(CPU): " << std::string(fva_status_string(st)) << ": " << std::string(fva_last_error()));
  }
  ~CpuHandle() { fva_destroy(h); }
  CpuHandle(const CpuHandle&) = delete;
  CpuHandle& operator=(const CpuHandle&) = delete;
};

// Exactly the queried number of bytes, 64-byte aligned, filled with 0xFF so that a backend relying on
// zeroed scratch fails.
inline AlignedBuffer workspace(size_t bytes) {
  AlignedBuffer ws(bytes);
  if (bytes) std::memset(ws.data(), 0xFF, bytes);
  return ws;
}

}  // namespace fvt

// REQUIRE that an fvattn call returns FVA_OK, showing the status and message when it does not.
#define REQUIRE_OK(call)                                                                          \
  do {                                                                                            \
    const fva_status_t st_ = (call);                                                              \
    REQUIRE_MESSAGE(st_ == FVA_OK, #call << " -> " << std::string(fva_status_string(st_)) << ": " << std::string(fva_last_error())); \
  } while (0)
