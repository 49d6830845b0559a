// How fast can an sm_90 kernel add fp32 tiles into a buffer in global memory (the fused backward's
// dQ accumulation)? Runs on the device machine:
//   nvcc -O3 -arch=sm_90a -o /tmp/reduce_probe tools/lab/reduce_probe.cu && /tmp/reduce_probe
// Each of 2048 blocks (128 threads, like the dK/dV kernel's consumer warpgroup) adds 64 tiles of
// 64 x 128 fp32 (32 KiB, one tile pair's dQ part) into a 64 MiB buffer (2048 tiles: the QAT dQ
// accumulator at B=1, H=8, S=16384, D=128), 4 GiB in all, by
//   red    red.global.add.v4.f32 from registers, a warp's 16-byte reductions covering 512
//          contiguous bytes (the fused kernel's way);
//   bulk   each warp stages its 8 KiB in shared memory, 2 KiB at a time, and adds it with one
//          cp.reduce.async.bulk (the TMA) per 2 KiB (FlashAttention-3's way); bulk2 the same
//          with two staging buffers per warp;
//   store  plain st.global.v4 of the same bytes (no addition: the write bandwidth the others
//          compare against);
// with the tile of each block's step s either the same for every block (tile s: all blocks add
// into the same tiles at once) or spread (tile (37 s + block) mod 2048). Prints GB/s of reduced
// (or stored) bytes per way and pattern, CUDA events, median of 5 after a warm-up.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

constexpr int kTiles = 2048, kTileFloats = 64 * 128, kBlocks = 2048, kSteps = 64;

__device__ __forceinline__ int tile_of(int step, bool spread) {
  return spread ? (37 * step + static_cast<int>(blockIdx.x)) % kTiles : step;
}

__global__ void __launch_bounds__(128) reduce_red(float* acc, bool spread) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float v[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  for (int s = 0; s < kSteps; ++s) {
    float* tile = acc + static_cast<size_t>(tile_of(s, spread)) * kTileFloats;
    float* at = tile + (warp * 16 * 32 + lane) * 4;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(at + j * 128), "f"(v[0]),
                   "f"(v[1]), "f"(v[2]), "f"(v[3])
                   : "memory");
  }
}

__global__ void __launch_bounds__(128) reduce_store(float* acc, bool spread) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int s = 0; s < kSteps; ++s) {
    float* tile = acc + static_cast<size_t>(tile_of(s, spread)) * kTileFloats;
    float4* at = reinterpret_cast<float4*>(tile + (warp * 16 * 32 + lane) * 4);
#pragma unroll
    for (int j = 0; j < 16; ++j) at[j * 32] = make_float4(1.0f, 2.0f, 3.0f, static_cast<float>(s));
  }
}

// kBuffers 2 KiB buffers per warp: with two, a chunk's staging overlaps the previous chunk's
// reduction.
template <int kBuffers>
__global__ void __launch_bounds__(128) reduce_bulk(float* acc, bool spread) {
  __shared__ __align__(128) float stage[4][kBuffers][512];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int s = 0; s < kSteps; ++s) {
    float* tile = acc + static_cast<size_t>(tile_of(s, spread)) * kTileFloats;
    float* warp_part = tile + warp * 16 * 32 * 4;  // 8 KiB per warp
    for (int chunk = 0; chunk < 4; ++chunk) {
      const uint32_t buf =
          static_cast<uint32_t>(__cvta_generic_to_shared(&stage[warp][chunk % kBuffers][0]));
      // The buffer's previous bulk reduction has read it (lane 0 waited), then every lane writes.
      __syncwarp();
#pragma unroll
      for (int j = 0; j < 4; ++j)
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(buf + (j * 32 + lane) * 16),
                     "f"(1.0f), "f"(2.0f), "f"(3.0f), "f"(4.0f)
                     : "memory");
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncwarp();
      if (lane == 0) {
        asm volatile(
            "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], 2048;\n" ::"l"(
                warp_part + chunk * 512),
            "r"(buf)
            : "memory");
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kBuffers - 1) : "memory");
      }
    }
  }
  if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

template <typename Kernel>
float median_ms(Kernel k, float* acc, bool spread) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  k<<<kBlocks, 128>>>(acc, spread);  // warm-up
  std::vector<float> ms;
  for (int i = 0; i < 5; ++i) {
    cudaEventRecord(a);
    k<<<kBlocks, 128>>>(acc, spread);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms[2];
}

}  // namespace

int main() {
  float* acc = nullptr;
  if (cudaMalloc(&acc, sizeof(float) * kTiles * kTileFloats) != cudaSuccess) return 1;
  cudaMemset(acc, 0, sizeof(float) * kTiles * kTileFloats);
  const double bytes = 4.0 * kTileFloats * kSteps * kBlocks;
  std::printf("way    pattern   ms      GB/s  (%.1f GiB as 32 KiB tiles into 64 MiB)\n",
              bytes / (1 << 30));
  for (bool spread : {false, true}) {
    const char* pat = spread ? "spread" : "same";
    const float r = median_ms(reduce_red, acc, spread);
    const float u = median_ms(reduce_bulk<1>, acc, spread);
    const float u2 = median_ms(reduce_bulk<2>, acc, spread);
    const float w = median_ms(reduce_store, acc, spread);
    std::printf("red    %-7s %7.3f %8.0f\n", pat, r, bytes / r / 1e6);
    std::printf("bulk   %-7s %7.3f %8.0f\n", pat, u, bytes / u / 1e6);
    std::printf("bulk2  %-7s %7.3f %8.0f\n", pat, u2, bytes / u2 / 1e6);
    std::printf("store  %-7s %7.3f %8.0f\n", pat, w, bytes / w / 1e6);
  }
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("status: %s\n", cudaGetErrorString(e));
  cudaFree(acc);
  return e == cudaSuccess ? 0 : 1;
}
