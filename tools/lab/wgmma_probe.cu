// How fast the H200's tensor cores run the VSA forward's two products when nothing else is in the
// way: S = Q Kᵀ (m64n64, both operands from shared memory, 8 k16 steps) and o += P V (m64n128, P
// from registers, 4 k16 steps), alone and alternating, one warpgroup per block, 1-4 blocks per SM,
// each product waited for before the next (the forward's chain) or several in flight. A bound for
// the forward's tensor work (not a test: it checks nothing, the data are arbitrary).
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I kernels -o /tmp/wgmma_probe tools/lab/wgmma_probe.cu
//   /tmp/wgmma_probe
#include <cstdio>
#include <cuda_runtime.h>

#include "primitives/sm90.cuh"
#include "probe_timer.h"

using namespace fva::dev::sm90;
using T = fva::dev::Bf16;
constexpr int D = 128;

// mode 0: S only; 1: P·V only; 2: S then P·V (each waited for); 3: S and P·V issued together,
// one wait; 4: two S products (two 32-register accumulators) issued together, one wait.
__device__ __forceinline__ void pack(const float (&s)[32], uint32_t (&a)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(a[i][e]) : "f"(s[8 * i + 2 * e + 1]), "f"(s[8 * i + 2 * e]));
}

// Mode 3 holds S, o and P at once (112 registers): at four blocks per SM it would spill, so it
// is built for three (a fourth block then waits for a slot).
template <int mode>
__global__ void __launch_bounds__(128, mode == 3 ? 3 : 4) probe(int iters, float* sink) {
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023) & ~1023u;
  const uint32_t q_tile = base, k_tile = base + 16384, v_tile = base + 32768;
  for (int i = threadIdx.x; i < 3 * 16384 / 4; i += 128)
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(base + 4 * i), "r"(0x3c003c00u ^ (i * 2654435761u & 0x00ff00ffu)));
  fence_proxy_async();
  __syncthreads();
  float s[32], s2[32], o[64];
  for (int i = 0; i < 32; ++i) s[i] = s2[i] = 0.0f;
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  uint32_t a[4][4];
  for (int i = 0; i < 4; ++i)
    for (int e = 0; e < 4; ++e) a[i][e] = 0x3c003c00u + threadIdx.x + i + e;
  // Reading one result of every S keeps ptxas from dropping the products whose accumulators the
  // next S overwrites (without it, S alone reports a rate above the card's peak).
  float seen = 0.0f;
  for (int it = 0; it < iters; ++it) {
    if constexpr (mode == 0 || mode == 2) {
      wgmma_fence();
      wgmma_tiles_abt<T, D>(s, q_tile, k_tile);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(s);
      seen += s[0];
    }
    if constexpr (mode == 2 || mode == 3) pack(s, a);  // P from S, as the forward does
    if constexpr (mode == 1 || mode == 2) wgmma_rs_tile_complete<T, D>(o, a, v_tile);
    if constexpr (mode == 3) {
      wgmma_fence();
      wgmma_tiles_abt<T, D>(s, q_tile, k_tile);
      wgmma_rs_tile_steps<T, D>(o, a, v_tile);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(s);
      fence_registers(o);
      keep_operands_alive(a);
    }
    if constexpr (mode == 4) {
      wgmma_fence();
      wgmma_tiles_abt<T, D>(s, q_tile, k_tile);
      wgmma_tiles_abt<T, D>(s2, q_tile, v_tile);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(s);
      fence_registers(s2);
      seen += s[0] + s2[0];
    }
  }
  float acc = seen;
  if constexpr (mode == 0 || mode == 4)
    for (int i = 0; i < 32; ++i) acc += s[i];
  if constexpr (mode == 4)
    for (int i = 0; i < 32; ++i) acc += s2[i];
  if constexpr (mode == 1 || mode == 2 || mode == 3)
    for (int i = 0; i < 64; ++i) acc += o[i];
  if (acc == 12345.0f) sink[threadIdx.x] = acc;
}

template <int mode>
double run(int per_sm, int sms, float* sink) {
  const int smem = 3 * 16384 + 1024, iters = 4000, blocks = sms * per_sm;
  cudaFuncSetAttribute(probe<mode>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const float best = best_launch_ms(
      [&](int n) { probe<mode><<<blocks, 128, smem>>>(n, sink); }, 100, iters);
  if (best < 0) return -1;
  const double flops = (mode == 0 || mode == 1 ? 2.0 : 4.0) * 64 * 64 * D;
  return flops * iters * blocks / (best * 1e-3) / 1e12;
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* sink;
  cudaMalloc(&sink, 4096);
  const char* names[] = {"S (ss n64)", "PV (rs n128)", "S, PV chain", "S+PV one wait", "2 S one wait"};
  printf("%-16s %10s %10s %10s %10s  (TFLOPS at 1..4 blocks per SM)\n", "mode", "1", "2", "3", "4");
  for (int mode = 0; mode < 5; ++mode) {
    printf("%-16s", names[mode]);
    for (int per_sm = 1; per_sm <= 4; ++per_sm) {
      double t = 0;
      switch (mode) {
        case 0: t = run<0>(per_sm, sms, sink); break;
        case 1: t = run<1>(per_sm, sms, sink); break;
        case 2: t = run<2>(per_sm, sms, sink); break;
        case 3: t = run<3>(per_sm, sms, sink); break;
        case 4: t = run<4>(per_sm, sms, sink); break;
      }
      printf(" %10.1f", t);
    }
    printf("\n");
  }
  return 0;
}
