// Delta = rowsum(o_for_bwd * dO) in fp32, the backward's pre-pass (QAT and VSA alike). It reads the
// call's inputs alone and writes a workspace region no earlier kernel of the call touches, so it
// runs beside the kernel launched before it (primitives/kernel_chain.cuh); its count, where it
// keeps one, follows that kernel's completion (count_delta_block).
#include "portable/attention_backward.cuh"
#include "primitives/kernel_chain.cuh"

extern "C" __global__ void fva_delta_bf16_d64(const fva::kern::AttentionParams p) {
  fva::dev::run_beside_prior_kernels([&] { fva::dev::attention_delta<fva::dev::Bf16, 64>(p); });
  fva::dev::count_delta_block(p);
}
extern "C" __global__ void fva_delta_bf16_d128(const fva::kern::AttentionParams p) {
  fva::dev::run_beside_prior_kernels([&] { fva::dev::attention_delta<fva::dev::Bf16, 128>(p); });
  fva::dev::count_delta_block(p);
}
extern "C" __global__ void fva_delta_f16_d64(const fva::kern::AttentionParams p) {
  fva::dev::run_beside_prior_kernels([&] { fva::dev::attention_delta<fva::dev::F16, 64>(p); });
  fva::dev::count_delta_block(p);
}
extern "C" __global__ void fva_delta_f16_d128(const fva::kern::AttentionParams p) {
  fva::dev::run_beside_prior_kernels([&] { fva::dev::attention_delta<fva::dev::F16, 128>(p); });
  fva::dev::count_delta_block(p);
}
