// Rounding of fp32 values to the narrow formats fvattn stores or simulates: bf16 and fp16 (the
// tensor dtypes), FP8 E4M3 (NVFP4 block scales) and FP4 E2M1 (NVFP4 elements).
//
// The host code is written with integer bit operations and comparisons, never with the hardware
// conversion instructions, so that the CPU reference gets the same bits as every GPU architecture.
// On the device, E4M3 rounding uses the sm_89+ conversion instruction and E2M1 rounding a shorter
// arithmetic form; tests/gpu/nvfp4_device_parity shows them bit-identical to the host code.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "shared/host_device.h"

namespace fva {

FVA_HD uint32_t float_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

FVA_HD float bits_float(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

// ---- bf16 -----------------------------------------------------------------------------------------

// fp32 -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN.
FVA_HD uint16_t bf16_bits_from_float(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

FVA_HD float float_from_bf16_bits(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

FVA_HD float round_to_bf16(float x) { return float_from_bf16_bits(bf16_bits_from_float(x)); }

// ---- fp16 -----------------------------------------------------------------------------------------

// fp32 -> IEEE binary16 bits, round to nearest even, overflow to inf, subnormals kept.
FVA_HD uint16_t f16_bits_from_float(float x) {
  const uint32_t u = float_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a >= 0x38800000u) {                                              // normal half (>= 2^-14)
    uint32_t r = a - 0x38000000u;                                      // rebias exponent 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  if (a < 0x33000000u) return sign;  // below 2^-25: rounds to zero (2^-25 itself ties to 0)
  // Subnormal half: value = m * 2^-24 with m in [0, 1024); shift the full significand.
  const uint32_t exp = a >> 23;
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exp;  // 14..24 for exp in [102, 112]
  uint32_t m = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (m & 1u))) ++m;
  return static_cast<uint16_t>(sign | m);
}

FVA_HD float float_from_f16_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  // Subnormal or zero: mant * 2^-24, exact in fp32.
  const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

FVA_HD float round_to_f16(float x) { return float_from_f16_bits(f16_bits_from_float(x)); }

// ---- FP8 E4M3 (the "fn" variant: no inf, max 448) --------------------------------------------------

constexpr float kE4M3Max = 448.0f;

// Magnitude of x rounded to E4M3 with round-to-nearest-even and saturation to 448 (satfinite).
// Subnormals are kept (step 2^-9); magnitudes at or below 2^-10 round to 0. NaN and inf saturate to
// 448, which is what the NVFP4 scale of a group holding them needs (SPEC: such inputs saturate).
FVA_HD float e4m3_round_magnitude(float x) {
  const uint32_t a = float_bits(x) & 0x7fffffffu;
  const float ax = bits_float(a);
  if (!(ax <= kE4M3Max)) return kE4M3Max;  // > 448, inf, NaN
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // The hardware conversion (sm_89+) rounds exactly like the code below for 0 <= ax <= 448
  // (round-to-nearest-even, E4M3 subnormals, 2^-10 and below to 0); tests/gpu/nvfp4_device_parity
  // checks them against each other over every bf16 pattern and a dense sweep of fp32 values.
  uint16_t e8x2;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(e8x2) : "f"(0.0f), "f"(ax));
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(e8x2));
  float out;
  asm("cvt.f32.f16 %0, %1;" : "=f"(out) : "h"(static_cast<uint16_t>(h2 & 0xffffu)));
  return out;
#else
  if (a < 0x3c800000u) {                    // below 2^-6: subnormal grid of 2^-9
    // ax * 512 < 8 is exact; round half to even by hand (no dependence on the FP rounding mode).
    const float t = ax * 512.0f;
    float n = static_cast<float>(static_cast<int>(t));  // floor, t >= 0
    const float frac = t - n;
    if (frac > 0.5f || (frac == 0.5f && (static_cast<int>(n) & 1))) n += 1.0f;
    return n * (1.0f / 512.0f);
  }
  // Normal: keep 3 mantissa bits, round the 20 dropped bits to nearest even.
  uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
  r &= ~0xfffffu;
  const float v = bits_float(r);
  return v > kE4M3Max ? kE4M3Max : v;
#endif
}

// ---- FP4 E2M1 -------------------------------------------------------------------------------------

constexpr float kE2M1Max = 6.0f;

// |y| rounded to the E2M1 grid in 5 instructions, the device's form (host and device alike, so that
// the CPU tests check the formula; the host's e2m1_round keeps the ladder below, SPEC's definition):
// adding and subtracting c, a power of two whose fp32 ulp is the grid step (2^22: step 0.5 below 2;
// 2^23: step 1 below 4; 2^24: step 2 above), rounds to the step with round-half-to-even, which is
// E2M1's tie rule (0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 3.5 -> 4, 5 -> 4). The input is saturated at 6
// first (inf too; NaN as well on the device, whose fminf returns the number), so c = 2^22 *
// 2^floor(log2(max(y, 1))), the exponent bits of max(y, 1), and both steps are FMAs with that power
// of two: y + c rounds once, (y + c) - c is exact. a >= 0 or NaN. Equal to the ladder for every
// non-NaN float (tests/test_nvfp4_formats.cpp on the host; tests/gpu/nvfp4_device_parity, NaNs
// included, on the device).
FVA_HD float e2m1_round_magnitude_fma(float a) {
  const float y = fminf(a, 6.0f);
  const float step = bits_float(float_bits(fmaxf(y, 1.0f)) & 0x7f800000u);  // 1, 2, 4
  return fmaf(step, -4194304.0f, fmaf(step, 4194304.0f, y));
}

// The same rounding carried out in bf16 arithmetic, two values per instruction on the device
// (e2m1_round_scale_bf16x2 below; this host form is the same algorithm one value at a time, so the
// CPU tests check it against the ladder). Rounding a >= 0 to bf16 first would round twice, and a
// value just above an E2M1 tie could land on the tie and round down; rounding to odd does not (the
// dropped bits are ORed into the lowest kept bit, so no inexact value lands on a tie, which has at
// most 3 significant bits, and 8 bits are more than 2 + 2): the E2M1 result is that of a itself.
// Then as in e2m1_round_magnitude_fma, in bf16 (7 stored mantissa bits, so the magic constant is
// 2^6 times the step): saturate at 6, step from the exponent bits of max(y, 1), round with one FMA
// (exact product and sum, one bf16 rounding) and subtract exactly.
FVA_HD uint16_t bf16_bits_round_to_odd(float a) {
  const uint32_t u = float_bits(a);
  return static_cast<uint16_t>((u >> 16) | ((u & 0xffffu) != 0u ? 1u : 0u));
}
FVA_HD float e2m1_round_magnitude_bf16_odd(float a) {
  const float ro = float_from_bf16_bits(bf16_bits_round_to_odd(a));
  const float y = ro <= 6.0f ? ro : 6.0f;  // NaN and inf too, as the device's min.bf16x2
  const float step = bits_float(float_bits(y >= 1.0f ? y : 1.0f) & 0x7f800000u);
  // step * 64 + y is exact in fp32 wherever the sum's rounding to bf16 can move q (y >= step *
  // 2^-10; below that q is 0 either way), so rounding the fp32 sum to bf16 is the FMA's rounding.
  const float t = round_to_bf16(step * 64.0f + y);
  return t - step * 64.0f;
}

// y rounded to the E2M1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} (with y's sign), nearest even code on a tie
// (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), saturating at 6; NaN and
// inf give +-6. The sign of zero follows y (FastVideo's fake quantization keeps -0).
FVA_HD float e2m1_round(float y) {
  const uint32_t sign = float_bits(y) & 0x80000000u;
  const float a = bits_float(float_bits(y) & 0x7fffffffu);
#if defined(__CUDA_ARCH__)
  return bits_float(float_bits(e2m1_round_magnitude_fma(a)) | sign);
#else
  float q;
  if (!(a <= 5.0f)) q = 6.0f;  // (5, inf], NaN
  else if (a >= 3.5f) q = 4.0f;
  else if (a >= 2.5f) q = a > 2.5f ? 3.0f : 2.0f;
  else if (a >= 1.75f) q = 2.0f;
  else if (a > 1.25f) q = 1.5f;
  else if (a >= 0.75f) q = 1.0f;
  else if (a > 0.25f) q = 0.5f;
  else q = 0.0f;
  return bits_float(float_bits(q) | sign);
#endif
}

#if defined(__CUDACC__)
// Two magnitudes y0, y1 >= 0 (or NaN) rounded to the E2M1 grid as e2m1_round_magnitude_bf16_odd
// does, each multiplied by its bf16 scale (scale2: the pair of scales, low half for y0), as a
// packed bf16x2 (y0 low): the NVFP4 decode of FQ_P for the bf16 P·V operand, in ten instructions
// per pair where the fp32 form takes thirteen. When the scales are E4M3 values the product is
// exact (2 + 4 significant bits), so the result is bitwise bf16(e2m1_round_magnitude_fma(y) * s);
// tests/gpu/nvfp4_device_parity checks it over every fp32 value up to 16. (min.u16x2 needs sm_90;
// below, the same values one at a time.)
__device__ __forceinline__ uint32_t e2m1_round_scale_bf16x2(float y0, float y1, uint32_t scale2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  const float q0 = round_to_bf16(e2m1_round_magnitude_bf16_odd(y0) * bits_float(scale2 << 16));
  const float q1 = round_to_bf16(e2m1_round_magnitude_bf16_odd(y1) * bits_float(scale2 & 0xffff0000u));
  return (float_bits(q0) >> 16) | (float_bits(q1) & 0xffff0000u);
#else
  const uint32_t u0 = float_bits(y0), u1 = float_bits(y1);
  const uint32_t high = __byte_perm(u0, u1, 0x7632), low = __byte_perm(u0, u1, 0x5410);
  uint32_t sticky, a, m, t, q, out;
  asm("min.u16x2 %0, %1, %2;" : "=r"(sticky) : "r"(low), "r"(0x00010001u));
  a = high | sticky;  // rounded to odd
  asm("min.bf16x2 %0, %1, %2;" : "=r"(a) : "r"(a), "r"(0x40c040c0u));  // 6
  asm("max.bf16x2 %0, %1, %2;" : "=r"(m) : "r"(a), "r"(0x3f803f80u));  // 1
  const uint32_t step = m & 0x7f807f80u;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(t) : "r"(step), "r"(0x42804280u), "r"(a));  // 64
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(q) : "r"(step), "r"(0xc280c280u), "r"(t));  // -64
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(out) : "r"(q), "r"(scale2));
  return out;
#endif
}
#endif

}  // namespace fva
