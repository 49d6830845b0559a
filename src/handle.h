// What a handle holds: the backend it resolved to, its resolved options, and for CUDA the device it
// is bound to.
#pragma once

#include <cstdint>
#include <string>

#include "checks.h"
#include "core/options.h"
#include "cuda/driver.h"
#include "error.h"
#include "fvattn/fvattn.h"

struct fva_handle {
  int32_t backend = FVA_BACKEND_CPU;  // resolved: never FVA_BACKEND_AUTO
  int32_t deterministic = 0;
  int32_t kernels = FVA_KERNELS_AUTO;  // FVA_KERNELS_*: may the CUDA backend use native kernels
  fva::TuningOptions tuning;           // resolved by fva_create (core/options.h)
  int threads = 1;                     // CPU backend worker threads (tuning.cpu_threads)
  fva::cuda::DeviceInfo device;       // CUDA backend only
  std::string image = "cpu";          // kernel image in use ("none": no image fits the device)
  std::string image_reason = "the CPU reference backend runs no kernel image";
};

namespace fva {

// h is not null (FVA_ERR_INVALID_ARGUMENT otherwise).
const fva_handle& checked_handle(fva_handle_t h);

// Fails with FVA_ERR_UNSUPPORTED unless the handle's backend can run `op` (a public function name).
// Called after every argument check, so bad arguments are reported the same way on every backend.
void require_backend_support(const fva_handle& h, const char* op);

// The body of every *_workspace_size entry point: check the handle and `bytes`, build the problem
// (which checks the arguments), make sure the backend runs `op`, then write the size that
// size_of(handle, problem) gives (it may refuse what the handle's backend cannot run). *bytes is
// written only on success.
template <typename MakeProblem, typename SizeOf>
fva_status_t workspace_query(fva_handle_t h, size_t* bytes, const char* op, MakeProblem make_problem,
                             SizeOf size_of) {
  return guard([&] {
    const fva_handle& handle = checked_handle(h);
    check_not_null(bytes, "bytes");
    const auto problem = make_problem();
    require_backend_support(handle, op);
    *bytes = size_of(handle, problem);
  });
}

}  // namespace fva
