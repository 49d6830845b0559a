// Device probe (not a test): records the GPU's approximate reciprocal (MUFU.RCP, what
// rcp.approx.f32 and div.full.f32 compile to) for every fp32 mantissa, and checks that a host model
// built on that table reproduces div.full.f32 bit for bit.
//
// div.full.f32 compiles (sm_80 to sm_120, nvcc 13) to: if |y| > 2^126 both operands are scaled by
// 1/4; if |y| < 2^-126 (or y is NaN) both are scaled by 2^24; then x * MUFU.RCP(y), rounded to
// nearest. MUFU.RCP of a normal y = ±m 2^e (m in [1, 2)) is assumed to be ±rcp(m) 2^-e, with rcp a
// function of m's 23 fraction bits alone; the probe checks that assumption on random y of every
// exponent. The table it writes holds, for each fraction f, the difference in ulps between
// MUFU.RCP(1 + f 2^-23) and the correctly rounded 1 / (1 + f 2^-23), two bits each
// (0: equal, 1: one ulp above, 2: one ulp below, 3: further; the probe fails if any entry is 3).
//   nvcc -std=c++17 -O2 -arch=sm_90a -o /tmp/rcp_approx_probe tools/lab/rcp_approx_probe.cu
//   /tmp/rcp_approx_probe OUT_TABLE.bin
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr uint32_t kFractions = 1u << 23;

__global__ void reciprocal_of_every_fraction(uint32_t* out) {
  const uint32_t f = blockIdx.x * blockDim.x + threadIdx.x;
  if (f >= kFractions) return;
  float r;
  asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(__uint_as_float(0x3F800000u | f)));
  out[f] = __float_as_uint(r);
}

__global__ void full_division(const float* x, const float* y, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(x[i]), "f"(y[i]));
  out[i] = r;
}

uint32_t bits(float v) { uint32_t b; std::memcpy(&b, &v, 4); return b; }
float from_bits(uint32_t b) { float v; std::memcpy(&v, &b, 4); return v; }

// The host model: MUFU.RCP of a normal y from the table, then div.full.f32's scaling around it.
struct Model {
  std::vector<uint32_t> rcp_of_fraction;  // MUFU.RCP(1 + f 2^-23) bits

  float rcp(float y) const {
    const uint32_t b = bits(y);
    const uint32_t exp = (b >> 23) & 0xFF, frac = b & 0x7FFFFF, sign = b & 0x80000000u;
    if (std::isnan(y)) return y;
    if (exp == 0xFF) return from_bits(sign);                 // 1 / ±inf = ±0
    if (exp == 0) return from_bits(sign | 0x7F800000u);      // subnormals flush: ±inf
    const int e = static_cast<int>(exp) - 127;
    const float r = std::ldexp(from_bits(rcp_of_fraction[frac]), -e);
    return from_bits(bits(r) | sign);
  }
  float div_full(float x, float y) const {
    const float ay = std::fabs(y);
    if (ay > 0x1p126f) { x *= 0.25f; y *= 0.25f; }
    if (!(ay >= 0x1p-126f)) { x *= 0x1p24f; y *= 0x1p24f; }
    return rcp(y) * x;
  }
};

bool same(float a, float b) { return bits(a) == bits(b) || (std::isnan(a) && std::isnan(b)); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) { std::fprintf(stderr, "usage: %s OUT_TABLE.bin\n", argv[0]); return 2; }
  uint32_t* d_rcp = nullptr;
  cudaMalloc(&d_rcp, kFractions * 4);
  reciprocal_of_every_fraction<<<kFractions / 256, 256>>>(d_rcp);
  Model model;
  model.rcp_of_fraction.resize(kFractions);
  cudaMemcpy(model.rcp_of_fraction.data(), d_rcp, kFractions * 4, cudaMemcpyDeviceToHost);
  if (cudaGetLastError() != cudaSuccess) { std::fprintf(stderr, "CUDA error\n"); return 1; }

  // The table: the difference to the correctly rounded reciprocal, two bits per fraction.
  std::vector<uint8_t> packed(kFractions / 4, 0);
  uint64_t count[4] = {0, 0, 0, 0};
  for (uint32_t f = 0; f < kFractions; ++f) {
    const float exact = 1.0f / from_bits(0x3F800000u | f);
    const int64_t d = static_cast<int64_t>(model.rcp_of_fraction[f]) - bits(exact);
    const uint32_t code = d == 0 ? 0 : d == 1 ? 1 : d == -1 ? 2 : 3;
    ++count[code];
    packed[f / 4] |= static_cast<uint8_t>(code << (2 * (f % 4)));
  }
  std::printf("rcp table: equal %llu, +1 ulp %llu, -1 ulp %llu, further %llu\n",
              (unsigned long long)count[0], (unsigned long long)count[1],
              (unsigned long long)count[2], (unsigned long long)count[3]);
  FILE* fp = std::fopen(argv[1], "wb");
  if (!fp || std::fwrite(packed.data(), 1, packed.size(), fp) != packed.size()) return 1;
  std::fclose(fp);

  // The model against div.full.f32: random bit patterns (every exponent, subnormals, inf, NaN),
  // x = 1 (MUFU.RCP alone through an exact product), and the corners.
  const int n = 1 << 24;
  std::vector<float> x(n), y(n), got(n);
  std::mt19937_64 rng(12345);
  for (int i = 0; i < n; ++i) {
    y[i] = from_bits(static_cast<uint32_t>(rng()));
    x[i] = (i % 4 == 0) ? 1.0f : from_bits(static_cast<uint32_t>(rng()));
    if (i % 8 == 1) x[i] = std::ldexp(1.0f + (rng() % 1024) / 1024.0f, static_cast<int>(rng() % 40) - 20);
    if (i % 8 == 2) y[i] = std::ldexp(1.0f + (rng() % 8388608) / 8388608.0f, static_cast<int>(rng() % 40) - 20);
  }
  const float corners[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1.0f, 0x1p126f, 0x1p127f, 0x1p-126f,
                           0x1p-149f, 0x1.fffffep127f, 6.0f, 2688.0f, 448.0f};
  int c = 0;
  for (float a : corners)
    for (float b : corners) { x[c] = a; y[c] = b; ++c; }
  float *dx, *dy, *dout;
  cudaMalloc(&dx, n * 4);
  cudaMalloc(&dy, n * 4);
  cudaMalloc(&dout, n * 4);
  cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dy, y.data(), n * 4, cudaMemcpyHostToDevice);
  full_division<<<n / 256, 256>>>(dx, dy, dout, n);
  cudaMemcpy(got.data(), dout, n * 4, cudaMemcpyDeviceToHost);
  if (cudaGetLastError() != cudaSuccess) { std::fprintf(stderr, "CUDA error\n"); return 1; }
  int mismatches = 0;
  for (int i = 0; i < n; ++i) {
    const float want = model.div_full(x[i], y[i]);
    if (!same(want, got[i])) {
      if (++mismatches <= 10)
        std::printf("mismatch: x %08x y %08x gpu %08x model %08x\n", bits(x[i]), bits(y[i]),
                    bits(got[i]), bits(want));
    }
  }
  std::printf("div.full.f32 against the model: %d mismatches in %d divisions\n", mismatches, n);
  return (mismatches == 0 && count[3] == 0) ? 0 : 1;
}
