// The shared NVFP4 header (kernels/nvfp4/nvfp4.h, nvfp4/float_formats.h) gives the same bits on the GPU
// as on the host, where the CPU reference backend runs it. Every GPU kernel quantizes with this
// header, so this is the parity the QAT kernels inherit.
//
// Exit status: 0 pass, 1 mismatch or CUDA error, 77 no CUDA device (CTest reports it as skipped).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "nvfp4/float_formats.h"
#include "nvfp4/nvfp4.h"
#include "primitives/online_softmax.cuh"  // fast_exp2

namespace {

struct Scalars {
  float e4m3, e2m1, bf16, f16;
};

__global__ void round_scalars(const float* x, Scalars* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = {fva::e4m3_round_magnitude(x[i]), fva::e2m1_round(x[i]), fva::round_to_bf16(x[i]),
            fva::round_to_f16(x[i])};
}

// One thread per 16-element group, in the mode `second` says.
__global__ void quantize_groups(const float* x, uint16_t* out, int groups, fva::Nvfp4SecondLevel second) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  const float* in = x + g * fva::kNvfp4GroupSize;
  float amax = 0.0f;
  for (int i = 0; i < fva::kNvfp4GroupSize; ++i) amax = fva::nvfp4_amax_step(amax, in[i]);
  const fva::Nvfp4Group grp = fva::nvfp4_group(amax, second);
  for (int i = 0; i < fva::kNvfp4GroupSize; ++i)
    out[g * fva::kNvfp4GroupSize + i] = fva::bf16_bits_from_float(fva::nvfp4_fake_quant(grp, in[i]));
}

// FastVideo's division (div.full.f32) on the device, which the host's table-driven copy must equal.
__global__ void fastvideo_divisions(const float* x, const float* y, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = fva::fastvideo_div(x[i], y[i]);
}

// nvfp4_block_group (the kernels' P scales: a fast exact reciprocal) for amax = |x|.
__global__ void block_groups(const float* x, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const fva::Nvfp4Group g = fva::nvfp4_block_group(fabsf(x[i]));
  out[2 * i] = g.e4m3;
  out[2 * i + 1] = g.reciprocal;
}

// The QAT forward takes a group's max p as 2^ of its max exponent (primitives/online_softmax.cuh), which
// holds only if the device's 2^x (MUFU.EX2, fast_exp2) is monotonic. Checked over every float from
// -inf up to 2^7 (the exponents a softmax evaluates are <= 0 but for rounding): for each, and its
// successor, 2^successor >= 2^x. Counts the violations.
__global__ void exp2_monotonic(unsigned long long* violations) {
  constexpr unsigned long long kNegatives = 0x7f800000ull;  // -inf .. -min subnormal, ascending
  constexpr unsigned long long kTotal = kNegatives + 0x43000000ull;
  unsigned long long bad = 0;
  for (unsigned long long i = blockIdx.x * static_cast<unsigned long long>(blockDim.x) + threadIdx.x;
       i < kTotal; i += static_cast<unsigned long long>(gridDim.x) * blockDim.x) {
    uint32_t x, next;
    if (i < kNegatives) {
      x = 0xff800000u - static_cast<uint32_t>(i);
      next = x - 1u;  // toward -0
    } else {
      x = static_cast<uint32_t>(i - kNegatives);
      next = x + 1u;
    }
    if (fva::dev::fast_exp2(__uint_as_float(next)) < fva::dev::fast_exp2(__uint_as_float(x))) ++bad;
  }
  if (bad != 0) atomicAdd(violations, bad);
}

// The bf16 P operand's packed decode (e2m1_round_scale_bf16x2, nvfp4/float_formats.h) against the fp32
// form, bitwise: every fp32 pattern from 0 to 16 (beyond, both saturate) and the specials (inf, a
// quiet and a signaling NaN), each as the low value of a pair whose high value is the pattern with
// its lowest bit flipped; each value scaled by one of the 126 nonzero E4M3 scales (the pattern's
// index picks it), as FQ_P decodes in block mode. Counts the mismatching halves.
__global__ void packed_e2m1_parity(unsigned long long* mismatches) {
  constexpr uint32_t kLast = 0x41800000u;  // 16
  constexpr unsigned long long kTotal = kLast + 1ull + 3;
  unsigned long long bad = 0;
  for (unsigned long long i = blockIdx.x * static_cast<unsigned long long>(blockDim.x) + threadIdx.x;
       i < kTotal; i += static_cast<unsigned long long>(gridDim.x) * blockDim.x) {
    const uint32_t specials[3] = {0x7f800000u, 0x7fc00000u, 0x7f800001u};
    const uint32_t b0 = i <= kLast ? static_cast<uint32_t>(i) : specials[i - kLast - 1];
    const uint32_t b1 = i <= kLast ? b0 ^ 1u : b0;
    const float y0 = __uint_as_float(b0), y1 = __uint_as_float(b1);
    const uint32_t code = 1u + static_cast<uint32_t>(i % 126u);  // E4M3 codes 1..126
    const uint32_t e = code >> 3, m = code & 7u;
    const float s = e == 0 ? ldexpf(static_cast<float>(m), -9) : ldexpf(1.0f + m / 8.0f, static_cast<int>(e) - 7);
    const uint32_t s_bf16 = __float_as_uint(s) >> 16;  // exact: 4 significant bits
    const uint32_t got = fva::e2m1_round_scale_bf16x2(y0, y1, s_bf16 | (s_bf16 << 16));
    const uint32_t want0 = fva::bf16_bits_from_float(fva::e2m1_round_magnitude_fma(y0) * s);
    const uint32_t want1 = fva::bf16_bits_from_float(fva::e2m1_round_magnitude_fma(y1) * s);
    bad += ((got & 0xffffu) != want0) + ((got >> 16) != want1);
  }
  if (bad != 0) atomicAdd(mismatches, bad);
}

// Runs a sweep kernel that adds what it counts to one device counter (4096 blocks of 256 threads,
// grid-stride); returns the count, or -1 after printing the CUDA error.
long long device_count(void (*kernel)(unsigned long long*), const char* name) {
  unsigned long long* counter = nullptr;
  unsigned long long n = 0;
  cudaError_t e = cudaMalloc(&counter, sizeof *counter);
  if (e == cudaSuccess) e = cudaMemset(counter, 0, sizeof *counter);
  if (e == cudaSuccess) {
    kernel<<<4096, 256>>>(counter);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(&n, counter, sizeof n, cudaMemcpyDeviceToHost);
  cudaFree(counter);
  if (e != cudaSuccess) std::fprintf(stderr, "%s failed: %s\n", name, cudaGetErrorString(e));
  return e == cudaSuccess ? static_cast<long long>(n) : -1;
}

bool same_bits(float a, float b) {
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub || (a != a && b != b);  // any NaN matches any NaN
}

#define CUDA_OK(call)                                                             \
  do {                                                                            \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));    \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  // Inputs: every bf16 bit pattern, then random fp32 values over many binades (both signs, ties
  // of the E2M1/E4M3 grids, subnormals, inf, NaN all occur among the bf16 patterns).
  std::vector<float> x;
  for (uint32_t b = 0; b < 65536; ++b) x.push_back(fva::float_from_bf16_bits(static_cast<uint16_t>(b)));
  std::mt19937 rng(12345);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-30, 12);
  while (x.size() % 16 != 0 || x.size() < 65536 + (1 << 20)) x.push_back(std::ldexp(mant(rng), expo(rng)));
  // A dense sweep of the ranges where the device's E4M3 (hardware conversion) and E2M1 (arithmetic)
  // paths could differ from the host's: every 3rd fp32 pattern from 2^-12 to 512, then every
  // multiple of 1/32 of each binade (all E4M3 and E2M1 grid points and midpoints) and the E2M1 ties.
  for (uint32_t b = 0x39800000u; b <= 0x44000000u; b += 3) {
    float f;
    std::memcpy(&f, &b, 4);
    x.push_back(f);
  }
  for (int e = -12; e <= 9; ++e)
    for (int m = 0; m < 32; ++m) x.push_back(std::ldexp(1.0f + m / 32.0f, e));
  for (float t : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f}) x.push_back(t);
  // Every E4M3 scale as a block group's scale: amax = 6 s (amax / 6 is then exactly s).
  for (uint32_t code = 1; code < 0x7f; ++code) {
    const uint32_t e = code >> 3, m = code & 7;
    const float s = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, static_cast<int>(e) - 7);
    x.push_back(6.0f * s);
  }
  while (x.size() % 16 != 0) x.push_back(0.0f);
  const int n = static_cast<int>(x.size());

  float* dx = nullptr;
  Scalars* ds = nullptr;
  uint16_t* dq = nullptr;
  CUDA_OK(cudaMalloc(&dx, n * sizeof(float)));
  CUDA_OK(cudaMalloc(&ds, n * sizeof(Scalars)));
  CUDA_OK(cudaMalloc(&dq, n * sizeof(uint16_t)));
  CUDA_OK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  round_scalars<<<(n + 255) / 256, 256>>>(dx, ds, n);
  CUDA_OK(cudaGetLastError());
  std::vector<Scalars> gs(n);
  CUDA_OK(cudaMemcpy(gs.data(), ds, n * sizeof(Scalars), cudaMemcpyDeviceToHost));

  long bad = 0;
  for (int i = 0; i < n; ++i) {
    const Scalars h{fva::e4m3_round_magnitude(x[i]), fva::e2m1_round(x[i]), fva::round_to_bf16(x[i]),
                    fva::round_to_f16(x[i])};
    if (!same_bits(h.e4m3, gs[i].e4m3) || !same_bits(h.e2m1, gs[i].e2m1) ||
        !same_bits(h.bf16, gs[i].bf16) || !same_bits(h.f16, gs[i].f16)) {
      if (bad++ < 5) std::fprintf(stderr, "scalar mismatch at x=%a\n", x[i]);
    }
  }

  {  // block groups: scale and reciprocal
    float* dg = nullptr;
    CUDA_OK(cudaMalloc(&dg, 2 * n * sizeof(float)));
    block_groups<<<(n + 255) / 256, 256>>>(dx, dg, n);
    CUDA_OK(cudaGetLastError());
    std::vector<float> gg(2 * n);
    CUDA_OK(cudaMemcpy(gg.data(), dg, 2 * n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaFree(dg);
    for (int i = 0; i < n; ++i) {
      const fva::Nvfp4Group h = fva::nvfp4_group(std::fabs(x[i]), fva::Nvfp4SecondLevel{});
      if ((!same_bits(h.e4m3, gg[2 * i]) || !same_bits(h.reciprocal, gg[2 * i + 1])) && bad++ < 10)
        std::fprintf(stderr, "block group mismatch at amax=%a: host %a %a device %a %a\n", x[i],
                     h.e4m3, h.reciprocal, gg[2 * i], gg[2 * i + 1]);
    }
  }

  {  // the sweeps that count on the device: 2^x monotonic, the packed bf16 decode
    const long long decreasing = device_count(exp2_monotonic, "exp2_monotonic");
    const long long packed = device_count(packed_e2m1_parity, "packed_e2m1_parity");
    if (decreasing < 0 || packed < 0) return 1;
    if (decreasing != 0)
      std::fprintf(stderr, "fast_exp2 is not monotonic: %lld decreasing steps\n", decreasing);
    if (packed != 0)
      std::fprintf(stderr, "e2m1_round_scale_bf16x2 differs from the fp32 form in %lld values\n",
                   packed);
    bad += static_cast<long>(decreasing + packed);
  }

  {  // FastVideo's division: the host's copy of MUFU.RCP (a table measured on an H100) against this
     // device's div.full.f32, on random bit patterns (every class) and on the ranges NVFP4 divides in
    const int m = 1 << 22;
    std::mt19937 rng(std::random_device{}());
    std::uniform_real_distribution<float> mant(1.0f, 2.0f);
    std::uniform_int_distribution<int> expo(-40, 40);
    std::vector<float> a(m), b(m), got(m);
    for (int i = 0; i < m; ++i) {
      if (i % 2 == 0) {
        uint32_t ba = rng(), bb = rng();
        std::memcpy(&a[i], &ba, 4);
        std::memcpy(&b[i], &bb, 4);
      } else {
        a[i] = (i % 4 == 1) ? 1.0f : std::ldexp(mant(rng), expo(rng));
        b[i] = std::ldexp(mant(rng), expo(rng));
      }
    }
    float *da = nullptr, *db = nullptr, *dout = nullptr;
    CUDA_OK(cudaMalloc(&da, m * sizeof(float)));
    CUDA_OK(cudaMalloc(&db, m * sizeof(float)));
    CUDA_OK(cudaMalloc(&dout, m * sizeof(float)));
    CUDA_OK(cudaMemcpy(da, a.data(), m * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(db, b.data(), m * sizeof(float), cudaMemcpyHostToDevice));
    fastvideo_divisions<<<(m + 255) / 256, 256>>>(da, db, dout, m);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(got.data(), dout, m * sizeof(float), cudaMemcpyDeviceToHost));
    cudaFree(da);
    cudaFree(db);
    cudaFree(dout);
    for (int i = 0; i < m; ++i) {
      const float h = fva::fastvideo_div(a[i], b[i]);
      if (!same_bits(h, got[i]) && !(std::isnan(h) && std::isnan(got[i])) && bad++ < 10)
        std::fprintf(stderr, "fastvideo_div mismatch: %a / %a: host %a device %a\n", a[i], b[i], h, got[i]);
    }
  }

  const int groups = n / 16;
  // Block mode, then tile-mode second levels (from made-up tile amaxes, the floor's included).
  for (float tile_amax : {0.0f, 3.75f, 0.0137f, 1e-9f, 417.3f}) {
    const fva::Nvfp4SecondLevel second = tile_amax == 0.0f ? fva::Nvfp4SecondLevel{} : fva::nvfp4_second_level(tile_amax);
    const float enc = second.enc;
    quantize_groups<<<(groups + 255) / 256, 256>>>(dx, dq, groups, second);
    CUDA_OK(cudaGetLastError());
    std::vector<uint16_t> gq(n);
    CUDA_OK(cudaMemcpy(gq.data(), dq, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    for (int g = 0; g < groups; ++g) {
      float amax = 0.0f;
      for (int i = 0; i < 16; ++i) amax = fva::nvfp4_amax_step(amax, x[g * 16 + i]);
      const fva::Nvfp4Group grp = fva::nvfp4_group(amax, second);
      for (int i = 0; i < 16; ++i) {
        const uint16_t h = fva::bf16_bits_from_float(fva::nvfp4_fake_quant(grp, x[g * 16 + i]));
        if (h != gq[g * 16 + i] && bad++ < 10)
          std::fprintf(stderr, "group mismatch (enc %g) at group %d element %d: host %04x device %04x\n",
                       enc, g, i, h, gq[g * 16 + i]);
      }
    }
  }
  cudaFree(dx);
  cudaFree(ds);
  cudaFree(dq);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("%s: %d values, %d groups x 5 modes, 2^22 divisions on %s (sm_%d%d): %ld mismatches\n",
              bad ? "FAIL" : "PASS", n, groups, prop.name, prop.major, prop.minor, bad);
  return bad ? 1 : 0;
}
