// Links fvattn::fvattn from an installed package and calls it.
#include <fvattn/fvattn.h>

#include <cstdio>

int main() {
  fva_handle_options_t opts = FVA_HANDLE_OPTIONS_INIT;
  opts.backend = FVA_BACKEND_CPU;
  fva_handle_t h = nullptr;
  if (fva_create(&h, &opts) != FVA_OK) return 1;
  std::printf("find_package consumer: fvattn %d, ABI %d\n", fva_version(), fva_abi_version());
  return fva_destroy(h) == FVA_OK && fva_abi_version() == FVA_ABI_VERSION ? 0 : 1;
}
