// The entry point every GPU test program shares: it skips (exit status 77, which CTest reports as
// skipped) where no CUDA handle can be made or the library has no kernel image for the device,
// sets up device memory on the handles' device, prints the run's seed and runs doctest.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "gpu/gpu_fixtures.h"

namespace fvt {

std::string gpu_skip_reason(int* device) {
  fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = FVA_BACKEND_CUDA;
  fva_handle_t h = nullptr;
  if (fva_create(&h, &o) != FVA_OK) return fva_last_error();
  fva_handle_info_t info;
  info.struct_size = sizeof info;
  fva_get_info(h, &info);
  fva_destroy(h);
  if (std::string(info.image) == "none")
    return std::string("no kernel image for ") + info.device_name + " in this build";
  *device = info.device;
  return "";
}

}  // namespace fvt

int main(int argc, char** argv) {
  using namespace fvt;
  int device = 0;
  const std::string why = gpu_skip_reason(&device);
  if (!why.empty()) {
    std::printf("SKIPPED: no usable GPU for the GPU tests: %s\n", why.c_str());
    return 77;
  }
  // Device memory (gpu_fixtures.h) on the device the handles get (FVA_HANDLE_OPTIONS_INIT: the
  // current context's, which this makes the one found above). A handle exists, so failing here is a
  // failure, not a skip.
  std::string no_memory;
  if (!cuda::init_memory(device, &no_memory)) {
    std::printf("FAILED: a CUDA handle exists but the tests cannot allocate device memory: %s\n",
                no_memory.c_str());
    return 1;
  }
  std::printf("seed %llu\n", static_cast<unsigned long long>(test_seed()));
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
