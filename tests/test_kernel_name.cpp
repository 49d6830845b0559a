// The CUDA backend names each kernel it launches with src/cuda/kernel_name.h (pieces put together
// on the stack, no formatting or allocation per launch): the names must be exactly the kernels'
// (kernels/instantiations.txt and the families' entry points), or the lookup fails.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "cuda/kernel_name.h"

using fva::cuda::KernelName;

TEST_CASE("KernelName puts the pieces of a kernel's name together") {
  CHECK(std::string(KernelName("fva_vsa_fwd_", "bf16", "_d", 128).c_str()) == "fva_vsa_fwd_bf16_d128");
  CHECK(KernelName("fva_sm90_", "qat", "_bwd_dkdv", "q", "_", "f16", "_d", int64_t{64}).str() ==
        "fva_sm90_qat_bwd_dkdvq_f16_d64");
  CHECK(KernelName("fva_qat_bwd_dkdv_", "bf16", "_d", 128, "").str() == "fva_qat_bwd_dkdv_bf16_d128");
  CHECK(KernelName("fva_layer_", "coarse_bwd_q", "_", "bf16", "_d", 0).str() == "fva_layer_coarse_bwd_q_bf16_d0");
  CHECK(KernelName("x", -42, 7u, std::string("_y")).str() == "x-427_y");
  CHECK(KernelName().str().empty());
}

TEST_CASE("KernelName: a name longer than its buffer is refused, not cut") {
  const std::string long_piece(200, 'a');
  const KernelName name("fva_", long_piece.c_str(), "_d", 128);
  CHECK(name.str() == "(kernel name too long)");
}
