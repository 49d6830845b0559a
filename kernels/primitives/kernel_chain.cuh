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

#include <stdint.h>

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

// ---- progress counters: a kernel that runs beside its predecessor on part of its output ---------
// griddepcontrol.wait orders whole kernels. Where a kernel needs only the part of its predecessor's
// output that comes first (the VSA layer's coarse forward needs the block means of q and k before
// those of v), the predecessor counts the units it finishes in a counter in global memory, zeroed
// before it starts, and the kernel waits on the count instead of on the whole predecessor. It still
// calls wait_for_prior_kernels() before it exits, which keeps the chain's order for the kernels
// after it. No deadlock: a kernel launched programmatically starts only once every block of its
// predecessor has called allow_next_kernel() (at its entry), so every block it waits for is
// resident or done; without the chain the kernels run one after the other and the counts are
// complete before the waiter starts.

// Counts one finished unit: the block's writes so far are visible on the GPU to a thread that then
// sees the new count. The block's threads synchronize first (their writes are ordered before the
// release by the barrier); one thread adds.
__device__ __forceinline__ void count_finished_unit(uint32_t* counter) {
  __syncthreads();
  if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
}

// Returns, to every thread of the block, once *counter has reached target: one thread polls with an
// acquire load, then the block synchronizes, so that what the counted units wrote is visible to every
// thread's later reads (cp.async and plain loads alike).
__device__ __forceinline__ void wait_for_count(const uint32_t* counter, uint32_t target) {
  if (threadIdx.x == 0) {
    for (;;) {
      uint32_t seen;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
      if (seen >= target) break;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
      __nanosleep(256);
#endif
    }
  }
  __syncthreads();
}

}  // namespace fva::dev
