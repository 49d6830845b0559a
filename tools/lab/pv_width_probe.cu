// What the QAT forward's P·V products cost on the H200's tensor cores by their width N: the
// forward issues, per 64-key tile and consumer, FQ_P(P)·V (m64n128) and P·[V | ones] (m64n136, the
// rows' sums riding on the product), 4 k16 steps each, P from registers. Is N = 136 charged as 136
// columns, or rounded up to a wider unit? Two blocks of one warpgroup per SM (the forward's two
// consumers), each tile's products waited for; nothing else runs. Reports TFLOPS of the columns
// actually issued (a width whose cost is rounded up shows a lower figure) and ns per tile.
// Not a test: it checks nothing, the data are arbitrary.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I kernels -o /tmp/pvw tools/lab/pv_width_probe.cu
//   /tmp/pvw
#include <cstdio>
#include <cuda_runtime.h>

#include "primitives/sm90.cuh"
#include "probe_timer.h"

using namespace fva::dev::sm90;
using T = fva::dev::Bf16;

// mode 0: n128 + n136 (the forward as it is); 1: n128 + n128; 2: n128 + n128 + n8 (the sums in
// their own product); 3: n136 alone; 4: n128 alone; 5: n8 alone.
template <int mode>
__global__ void __launch_bounds__(128, 2) probe(int iters, float* sink) {
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023) & ~1023u;
  for (int i = threadIdx.x; i < 3 * 16384 / 4; i += 128)
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(base + 4 * i), "r"(0x3c003c00u ^ (i * 2654435761u & 0x00ff00ffu)));
  fence_proxy_async();
  __syncthreads();
  float o[64], o_hp[68], l[4];
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  for (int i = 0; i < 68; ++i) o_hp[i] = 0.0f;
  for (int i = 0; i < 4; ++i) l[i] = 0.0f;
  float(&o_128)[64] = reinterpret_cast<float(&)[64]>(o_hp);
  uint32_t a[4][4];
  for (int i = 0; i < 4; ++i)
    for (int e = 0; e < 4; ++e) a[i][e] = 0x3c003c00u + threadIdx.x + i + e;
  const uint64_t v_base = smem_descriptor(base, 64 * 128, 1024);
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
#pragma unroll
    for (int step = 0; step < 4; ++step) {
      const uint64_t v = smem_descriptor_advance(v_base, step * 2048);
      if constexpr (mode <= 2 || mode == 4) wgmma_rs_mn<T, 128>(o, a[step], v);
      if constexpr (mode == 0 || mode == 3) wgmma_rs_mn<T, 136>(o_hp, a[step], v);
      if constexpr (mode == 1 || mode == 2) wgmma_rs_mn<T, 128>(o_128, a[step], v);
      if constexpr (mode == 2 || mode == 5) wgmma_rs_mn<T, 8>(l, a[step], v);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(o);
    fence_registers(o_hp);
    fence_registers(l);
    keep_operands_alive(a);
  }
  float acc = 0.0f;
  for (int i = 0; i < 64; ++i) acc += o[i];
  for (int i = 0; i < 68; ++i) acc += o_hp[i];
  for (int i = 0; i < 4; ++i) acc += l[i];
  if (acc == 12345.0f) sink[threadIdx.x] = acc;
}

template <int mode>
void run(const char* name, int columns, int sms, float* sink) {
  const int smem = 3 * 16384 + 1024, iters = 4000, blocks = 2 * sms;
  cudaFuncSetAttribute(probe<mode>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const float best = best_launch_ms(
      [&](int n) { probe<mode><<<blocks, 128, smem>>>(n, sink); }, 100, iters);
  if (best < 0) return;
  const double flops = 2.0 * 64 * 64 * columns;  // 4 k16 steps of m64 x n`columns`
  printf("%-28s %8.1f TFLOPS %8.1f ns per tile and block\n", name,
         flops * iters * blocks / (best * 1e-3) / 1e12, best * 1e6 / iters);
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* sink;
  cudaMalloc(&sink, 4096);
  run<0>("n128 + n136 (the forward)", 264, sms, sink);
  run<1>("n128 + n128", 256, sms, sink);
  run<2>("n128 + n128 + n8", 264, sms, sink);
  run<3>("n136", 136, sms, sink);
  run<4>("n128", 128, sms, sink);
  run<5>("n8", 8, sms, sink);
  return 0;
}
