// Device probe (not a test): does NVFP4 tile-mode fake quantization reproduce FastVideo's golden
// fake_q/k/v bit for bit when its divisions use the GPU's approximate div.full.f32, as Triton's do?
// The CPU reference divides exactly and differs from golden in ~0.5-1% of groups (SPEC.md
// section 1); this measures whether a GPU kernel can match FastVideo exactly by dividing the same way.
//   nvcc -std=c++17 -O2 -arch=sm_90a -I kernels -o /tmp/tile_division_probe tools/lab/tile_division_probe.cu
//   /tmp/tile_division_probe <golden case dir>   (e.g. tests/golden/qat/default_self_256)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "nvfp4/float_formats.h"

namespace {

std::vector<uint16_t> load_u16_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[8];
  f.read(magic, 8);
  uint16_t hlen = 0;
  f.read(reinterpret_cast<char*>(&hlen), 2);
  std::string header(hlen, ' ');
  f.read(&header[0], hlen);
  std::vector<uint16_t> data;
  uint16_t x;
  while (f.read(reinterpret_cast<char*>(&x), 2)) data.push_back(x);
  return data;
}

__device__ float div_full(float a, float b) {  // what Triton emits for fp32 '/'
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ float div_exact(float a, float b) { return __fdiv_rn(a, b); }

// One thread per (tile of 32 tokens, group of 16 channels); mode bit i picks div_full for division i:
// 0: enc = 2688 / tile_amax, 1: dec = 1 / enc, 2: amax / 6, 3: r = 1 / (s * dec).
__global__ void quantize_tiles(const float* x, uint16_t* out, int tokens, int D, int mode) {
  const int groups_per_row = D / 16;
  const int tile = blockIdx.x, g = threadIdx.x;
  if (g >= groups_per_row) return;
  float tile_amax = 0.0f;
  for (int t = tile * 32; t < tile * 32 + 32 && t < tokens; ++t)
    for (int d = 0; d < D; ++d) tile_amax = fmaxf(tile_amax, fabsf(x[t * D + d]));
  auto dv = [mode](int i, float a, float b) { return (mode >> i) & 1 ? div_full(a, b) : div_exact(a, b); };
  const float enc = dv(0, 2688.0f, fmaxf(tile_amax, 1e-8f));
  const float dec = dv(1, 1.0f, enc);
  for (int t = tile * 32; t < tile * 32 + 32 && t < tokens; ++t) {
    const float* in = x + t * D + g * 16;
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(in[i]));
    const float s = fva::e4m3_round_magnitude(dv(2, amax, 6.0f) * enc);
    const float sd = s * dec;
    const float r = sd > 0.0f ? dv(3, 1.0f, sd) : 0.0f;
    for (int i = 0; i < 16; ++i) {
      const float q = sd > 0.0f ? fva::e2m1_round(in[i] * r) * s * dec : 0.0f;
      out[t * D + g * 16 + i] = fva::bf16_bits_from_float(q);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string dir = argv[1];
  const int B = 1, H = 2, D = 128;
  std::vector<uint16_t> raw[3] = {load_u16_npy(dir + "/q.npy"), load_u16_npy(dir + "/k.npy"),
                                  load_u16_npy(dir + "/v.npy")};
  std::vector<uint16_t> gold[3] = {load_u16_npy(dir + "/fake_q.npy"), load_u16_npy(dir + "/fake_k.npy"),
                                   load_u16_npy(dir + "/fake_v.npy")};
  const int n = static_cast<int>(raw[0].size()), S = n / (B * H * D);
  // smooth_k (this case has it): k - mean over (B, H, S) per channel, both rounded to bf16 (torch).
  std::vector<float> x[3];
  for (int t = 0; t < 3; ++t)
    for (uint16_t b : raw[t]) x[t].push_back(fva::float_from_bf16_bits(b));
  for (int d = 0; d < D; ++d) {
    double sum = 0;
    for (int r = 0; r < B * H * S; ++r) sum += x[1][r * D + d];
    const float mean = fva::round_to_bf16(static_cast<float>(sum / (B * H * S)));
    for (int r = 0; r < B * H * S; ++r) x[1][r * D + d] = fva::round_to_bf16(x[1][r * D + d] - mean);
  }
  float* dx;
  uint16_t* dq;
  cudaMalloc(&dx, n * sizeof(float));
  cudaMalloc(&dq, n * sizeof(uint16_t));
  std::printf("divisions by div.full.f32 (bit 0 enc, 1 dec, 2 amax/6, 3 r): mismatching elements vs golden q / k-mean / v\n");
  for (int mode : {0, 1, 2, 4, 8, 15}) {
    int bad[3] = {0, 0, 0};
    for (int t = 0; t < 3; ++t) {
      std::vector<uint16_t> out(n);
      for (int bh = 0; bh < B * H; ++bh) {
        cudaMemcpy(dx, x[t].data() + bh * S * D, S * D * sizeof(float), cudaMemcpyHostToDevice);
        quantize_tiles<<<(S + 31) / 32, D / 16>>>(dx, dq, S, D, mode);
        cudaMemcpy(out.data() + bh * S * D, dq, S * D * sizeof(uint16_t), cudaMemcpyDeviceToHost);
      }
      for (int i = 0; i < n; ++i) bad[t] += out[i] != gold[t][i];
    }
    std::printf("  mode %2d: %d / %d / %d\n", mode, bad[0], bad[1], bad[2]);
  }
  const cudaError_t e = cudaGetLastError();
  std::printf("cuda: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
