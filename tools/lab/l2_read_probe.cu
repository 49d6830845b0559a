// How fast can an sm_90 GPU's SMs read 16 KiB tiles picked at random from a working set, the way
// the VSA kernels load their K and V tiles (the forward: 32 KiB per (q block, kv block) pair; the
// dQ kernel: a 16 KiB K tile and an 8 KiB dS tile)? This bounds what those kernels can reach.
// Runs on the device machine:
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/l2_read_probe tools/lab/l2_read_probe.cu && /tmp/l2_read_probe
// Working sets of 8, 16 and 32 MiB (they sit in the 50 MiB L2) and 4 GiB (DRAM). Each block reads
// kSteps tiles, tile (hash of block and step) mod the set's tile count, by
//   ldcg   plain 16-byte loads that bypass L1 (ld.global.cg.v4), 256 threads a block, 8 blocks an
//          SM, summed into a register so that nothing is optimized away;
//   bulk   cp.async.bulk (the TMA's copy engine) into a 2-stage shared-memory ring of 16 KiB
//          tiles with mbarriers, one 128-thread block per ring, 4 blocks an SM (the VSA forward's
//          occupancy); the bulk copy of 16 KiB is what the kernels' TMA loads of a tile move;
//   bulk4, bulk13: the same with deeper rings (4 stages, 3 blocks an SM: 12 tiles in flight per
//          SM; 13 stages, one block an SM), which tell whether more bytes in flight read faster
//          (is the ceiling the L2's bandwidth or the loads' latency?);
// and prints TB/s of tile bytes (CUDA events, median of 5 after a warm-up).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

constexpr int kTileBytes = 16384, kSteps = 256;

__device__ __forceinline__ uint32_t pick(uint32_t block, uint32_t step, uint32_t tiles) {
  uint32_t x = block * 0x9E3779B1u ^ (step + 1) * 0x85EBCA77u;
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 13;
  return x % tiles;
}

__global__ void __launch_bounds__(256) read_ldcg(const uint4* set, uint32_t tiles, uint32_t* sink) {
  uint32_t acc = 0;
  for (int s = 0; s < kSteps; ++s) {
    const uint4* tile = set + static_cast<size_t>(pick(blockIdx.x, s, tiles)) * (kTileBytes / 16);
#pragma unroll
    for (int j = 0; j < kTileBytes / 16 / 256; ++j) {
      uint4 v;
      asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(tile + j * 256 + threadIdx.x));
      acc += v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (acc == 0x12345678u) sink[0] = acc;  // never in practice; keeps the loads
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// kStages tiles (the ring) in the first kStages * kTileBytes bytes of `smem_tiles` tiles, then the
// kStages mbarriers.
template <int kStages>
__global__ void __launch_bounds__(128) read_bulk(const char* set, uint32_t tiles, uint32_t* sink,
                                                 int smem_tiles) {
  extern __shared__ __align__(128) char smem[];
  const uint32_t ring = smem_addr(smem);
  const uint32_t bars = ring + smem_tiles * kTileBytes;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bars + 8 * s));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int step) {
    const int s = step % kStages;
    const char* src = set + static_cast<size_t>(pick(blockIdx.x, step, tiles)) * kTileBytes;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bars + 8 * s),
                 "r"(kTileBytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
        ::"r"(ring + s * kTileBytes), "l"(src), "r"(kTileBytes), "r"(bars + 8 * s)
        : "memory");
  };
  if (threadIdx.x == 0)
    for (int step = 0; step < kStages; ++step) issue(step);
  uint32_t acc = 0;
  for (int step = 0; step < kSteps; ++step) {
    const int s = step % kStages;
    const uint32_t parity = (step / kStages) & 1;
    asm volatile(
        "{\n .reg .pred p;\n wait_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        " @!p bra wait_%=;\n}\n" ::"r"(bars + 8 * s),
        "r"(parity)
        : "memory");
    acc += reinterpret_cast<const uint32_t*>(smem + s * kTileBytes)[threadIdx.x];
    __syncthreads();  // every thread has read the stage before it is refilled
    if (threadIdx.x == 0 && step + kStages < kSteps) issue(step + kStages);
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

template <typename Launch>
double median_ms(Launch launch) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  launch();  // warm-up
  std::vector<float> t;
  for (int i = 0; i < 5; ++i) {
    cudaEventRecord(a);
    launch();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[2];
}

bool check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::printf("%s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t max_set = size_t{4} << 30;
  char* set = nullptr;
  uint32_t* sink = nullptr;
  if (!check(cudaMalloc(&set, max_set), "cudaMalloc") || !check(cudaMalloc(&sink, 4), "cudaMalloc"))
    return 1;
  cudaMemset(set, 1, max_set);
  // Each way: its kernel (none: ldcg), the tiles of shared memory a block takes (which set the
  // blocks an SM holds: 3 tiles' worth, the VSA forward's 48 KiB, holds 4), its ring's stages, and
  // those blocks.
  using BulkKernel = void (*)(const char*, uint32_t, uint32_t*, int);
  struct Way {
    const char* name;
    BulkKernel bulk;
    int smem_tiles, stages, blocks_per_sm;
    int smem() const { return smem_tiles * kTileBytes + 8 * stages; }
  };
  const Way ways[] = {{"ldcg", nullptr, 0, 0, 8},
                      {"bulk", read_bulk<2>, 3, 2, 4},
                      {"bulk4", read_bulk<4>, 4, 4, 3},
                      {"bulk13", read_bulk<13>, 13, 13, 1}};
  for (const Way& w : ways)
    if (w.bulk != nullptr)
      cudaFuncSetAttribute(w.bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, w.smem());
  std::printf("%d SMs; %d tiles of %d bytes per block\n", sms, kSteps, kTileBytes);
  std::printf("%-6s %10s %8s %10s %8s\n", "way", "set MiB", "blocks", "ms", "TB/s");
  for (const size_t mib : {size_t{8}, size_t{16}, size_t{32}, size_t{4096}}) {
    const uint32_t tiles = static_cast<uint32_t>((mib << 20) / kTileBytes);
    for (const Way& w : ways) {
      // Enough blocks for several waves, as the kernels have.
      const int blocks = sms * w.blocks_per_sm * 8;
      const double ms = median_ms([&] {
        if (w.bulk != nullptr)
          w.bulk<<<blocks, 128, w.smem()>>>(set, tiles, sink, w.smem_tiles);
        else
          read_ldcg<<<blocks, 256>>>(reinterpret_cast<const uint4*>(set), tiles, sink);
      });
      if (!check(cudaGetLastError(), w.name) || !check(cudaDeviceSynchronize(), w.name)) return 1;
      const double bytes = static_cast<double>(blocks) * kSteps * kTileBytes;
      std::printf("%-6s %10zu %8d %10.3f %8.2f\n", w.name, mib, blocks, ms, bytes / (ms * 1e9));
    }
  }
  cudaFree(set);
  cudaFree(sink);
  return 0;
}
