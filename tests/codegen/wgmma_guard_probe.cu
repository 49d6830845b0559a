// The probe of tests/codegen/check_wgmma_guard.sh: one wgmma product, and with FVA_GUARD_BAD a read
// of its accumulator while it is in flight, which makes ptxas serialize the wgmma (C751x: it injects
// a wait), so that cmake/nvcc_wgmma_guard.sh must fail the compile; with FVA_GUARD_STACK a local
// array indexed at run time (a stack frame), which the guard must reject too. Compiled, never run.
#include <cstdint>
extern "C" __global__ void serialized(float* out, uint64_t a_desc, uint64_t b_desc) {
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(a_desc), "l"(b_desc));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#ifdef FVA_GUARD_BAD
  out[threadIdx.x + 128] = d[0];  // read while the product is in flight
#endif
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  out[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
}
#ifdef FVA_GUARD_STACK
// A local array indexed at run time: local memory, a stack frame.
extern "C" __global__ void stack_frame(float* out, int i) {
  float local[64];
#pragma unroll 1
  for (int k = 0; k < 64; ++k) local[(k * 7 + i) & 63] = out[k];
  out[threadIdx.x] = local[i & 63] + local[(i + threadIdx.x) & 63];
}
#endif
