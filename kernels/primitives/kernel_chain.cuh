// The kernels of one fvattn call as a chain of programmatic dependent launches (PDL, sm_90 and
// later). The host launches every kernel of a call but its first with the driver's
// programmatic-stream-serialization attribute (src/cuda/kernel_images.cpp, LaunchChain), so the
// next kernel's blocks may become resident while the kernel before it in the stream still runs its
// last wave: their launch, and the SMs that wave leaves idle, overlap it. Each kernel therefore
//   1. calls allow_next_kernel() first: the next kernel is launched once every block of this one
//      has made that call (so a waiting block never holds an SM that a block of this kernel
//      still needs: all of them are already resident);
//   2. calls wait_for_prior_kernels() before it touches global memory that a kernel before it in
//      the call writes or reads: it returns once the previous kernel has completed and its writes
//      are visible. A kernel that waits before it completes also completes after its
//      predecessor, so the order is transitive along the chain.
// Launched without the attribute (the call's first kernel, FVATTN_PDL=0, drivers before CUDA
// 12.3), both are no-ops: the stream orders the kernels as usual.
#pragma once

namespace fva::dev {

__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prior_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The entry of a kernel that reads or writes what the kernels before it in its call do.
__device__ __forceinline__ void enter_kernel_chain() {
  allow_next_kernel();
  wait_for_prior_kernels();
}

// The entry of the generated kernels (kernels/CMakeLists.txt). `beside`
// (kern::runs_beside_prior_kernels): the kernel does not wait at entry; it waits where it first
// reads what the kernels before it write (await_block_terms, primitives/block_terms.cuh), which
// every thread that stores its results reaches, so it still completes after them.
__device__ __forceinline__ void enter_kernel_chain(bool beside) {
  allow_next_kernel();
  if (!beside) wait_for_prior_kernels();
}

// Runs `body` as a kernel that depends on nothing earlier in its call (it reads the call's inputs
// and writes memory no earlier kernel of the call touches: the backward's Delta), so it overlaps
// the kernel before it; it still waits for that kernel before it exits, which keeps the chain's
// order for the kernels after it.
template <typename Body>
__device__ __forceinline__ void run_beside_prior_kernels(Body&& body) {
  allow_next_kernel();
  body();
  wait_for_prior_kernels();
}

}  // namespace fva::dev
