// NVFP4 fake quantization (SPEC.md section 1), shared by the CPU reference backend and every GPU
// kernel: one implementation, so they agree bit for bit.
//
// A group is 16 consecutive values along the quantization axis. Its E4M3 scale is
//     s = e4m3(amax / 6 * enc)
// with enc the second-level encode factor (1 in block mode; 2688 / tile-or-row amax otherwise) and
// dec = 1 / enc. Each value is encoded as e2m1(x * r) with r = 1 / (s * dec) computed from the
// *rounded* s, and decoded as (e2m1 * s) * dec. A scale that rounds to 0 decodes the group to zeros.
// Tile and row modes divide as FastVideo's kernels do (fastvideo_division.h: div.full.f32, on the
// host too); block mode's divisions stay correctly rounded (r = 1 / s is the same either way for
// every E4M3 s, and its golden cases match FastVideo's bit for bit).
//
// Usage, per group:
//     float amax = 0; for (x in group, valid only) amax = nvfp4_amax_step(amax, x);
//     Nvfp4Group g = nvfp4_group(amax, second);   // second: Nvfp4SecondLevel{} in block mode,
//                                                 // nvfp4_second_level(tile amax) otherwise
//     for (x in group) out = nvfp4_fake_quant(g, x);   // then round to the tensor dtype
#pragma once

#include "nvfp4/fastvideo_division.h"
#include "nvfp4/float_formats.h"

namespace fva {

constexpr int kNvfp4GroupSize = 16;
// 448 (E4M3 max) * 6 (E2M1 max): the second-level scale maps the largest amax onto this value.
constexpr float kNvfp4SecondLevelTarget = 2688.0f;
// Floor on the second-level amax so an all-zero tile or row gives a finite factor.
constexpr float kNvfp4AmaxFloor = 1e-8f;

// Running max of |x| that ignores NaN (a NaN input must not poison its group's scale; it is itself
// saturated to +-6 by e2m1_round).
FVA_HD float nvfp4_amax_step(float amax, float x) {
#if defined(__CUDA_ARCH__)
  return fmaxf(amax, fabsf(x));  // one FMNMX with |x|; fmaxf ignores a NaN x, as the ladder does
#else
  const float a = bits_float(float_bits(x) & 0x7fffffffu);
  return a > amax ? a : amax;
#endif
}

// The second-level factors of a group: enc = dec = 1 in block mode (tile false); in tile and row
// mode enc = 2688 / max(amax, 1e-8) of the tile or row and dec = 1 / enc, divided as FastVideo does.
struct Nvfp4SecondLevel {
  float enc = 1.0f, dec = 1.0f;
  bool tile = false;
};

FVA_HD Nvfp4SecondLevel nvfp4_second_level(float amax) {
  Nvfp4SecondLevel s;
  s.enc = fastvideo_div(kNvfp4SecondLevelTarget, amax > kNvfp4AmaxFloor ? amax : kNvfp4AmaxFloor);
  s.dec = fastvideo_div(1.0f, s.enc);
  s.tile = true;
  return s;
}

struct Nvfp4Group {
  float e4m3;        // s: the group's E4M3 scale (0: the group decodes to zeros)
  float dec;         // the second-level decode factor (1 in block mode)
  float reciprocal;  // r = 1 / (s * dec), from the rounded s
};

// amax / 6, as the correctly rounded division gives it wherever it can matter. On the device the
// division becomes a product and one FMA correction (q0 = x * RN(1/6), q = q0 + (x - 6 q0) * RN(1/6)),
// which equals the IEEE quotient for every float x >= 2^-125 (checked exhaustively on the host);
// below that the quotient is subnormal and may differ by an ulp, but then amax / 6 * enc is below
// 2^-86 (enc <= 2688 / 1e-8 < 2^38) and E4M3 rounds both to 0, so the group scale is the same.
FVA_HD float nvfp4_div6(float x) {
#if defined(__CUDA_ARCH__)
  const float c = 1.0f / 6.0f;
  const float q0 = x * c;
  return fmaf(fmaf(-6.0f, q0, x), c, q0);
#else
  return x / 6.0f;
#endif
}

// A tile- or row-mode group's scale from its amax: FastVideo's three divisions (amax / 6, and
// r = 1 / (s * dec) from the rounded s; enc and dec came divided the same way).
FVA_HD Nvfp4Group nvfp4_tile_group(float amax, const Nvfp4SecondLevel& second) {
  Nvfp4Group g;
  g.e4m3 = e4m3_round_magnitude(fastvideo_div(amax, 6.0f) * second.enc);
  g.dec = second.dec;
  const float sd = g.e4m3 * second.dec;
  g.reciprocal = sd > 0.0f ? fastvideo_div(1.0f, sd) : 0.0f;
  return g;
}

// 1 / s for a block-scale group's scale s on the device: the reciprocal's fast path (MUFU.RCP and
// one Newton step, the sequence the compiler emits for 1.0f / s when s is well inside the normal
// range), without the range check and slow-path call around it. A block scale is 0 (handled
// here) or an E4M3 value in [2^-9, 448], inside that range, where the sequence is correctly
// rounded: it equals 1.0f / s for every such s (tests/gpu/nvfp4_device_parity checks all of them).
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float nvfp4_block_reciprocal(float s) {
  if (!(s > 0.0f)) return 0.0f;
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
  return fmaf(r, fmaf(-s, r, 1.0f), r);
}
#elif defined(__CUDACC__)
__device__ float nvfp4_block_reciprocal(float s);  // nvcc's host pass: declared for templates
#endif

// A block-mode group's scale from its amax (enc = dec = 1), correctly rounded divisions.
FVA_HD Nvfp4Group nvfp4_block_group(float amax) {
  Nvfp4Group g;
  g.e4m3 = e4m3_round_magnitude(nvfp4_div6(amax));
  g.dec = 1.0f;
#if defined(__CUDA_ARCH__)
  g.reciprocal = nvfp4_block_reciprocal(g.e4m3);
#else
  g.reciprocal = g.e4m3 > 0.0f ? 1.0f / g.e4m3 : 0.0f;
#endif
  return g;
}

// The group's scale from its amax, in the mode `second` says.
FVA_HD Nvfp4Group nvfp4_group(float amax, const Nvfp4SecondLevel& second) {
  return second.tile ? nvfp4_tile_group(amax, second) : nvfp4_block_group(amax);
}

// x fake-quantized with its group's scale, in fp32 (callers round to the tensor dtype). The decode
// is (e2m1 * s) * dec, left to right as FastVideo evaluates it: e2m1 * s is exact (3 + 4 significant
// bits), so block mode rounds only once, to the dtype; tile and row modes round the product with dec
// to fp32 first.
//
// The sign comes from x itself: x * r has x's sign for every finite x, but a NaN x loses its sign in
// the product on the GPU (which returns a canonical NaN) and keeps it on the host; taking x's sign
// bit makes NaN inputs saturate to the same +-6 everywhere.
FVA_HD float nvfp4_fake_quant(const Nvfp4Group& g, float x) {
  if (!(g.reciprocal > 0.0f)) return 0.0f;
  const float magnitude = e2m1_round(bits_float(float_bits(x * g.reciprocal) & 0x7fffffffu));
  const float q = bits_float(float_bits(magnitude) | (float_bits(x) & 0x80000000u));
  return q * g.e4m3 * g.dec;
}

#if defined(__CUDACC__)
// The E4M3 scales of two block-scale groups whose amaxes lie in [0, 1] (softmax probabilities
// relative to their running max), as nvfp4_block_group computes them: amax / 6 <= 1/6 is far below
// E4M3's 448, so the saturation check drops out, and one conversion instruction rounds both.
__device__ __forceinline__ void nvfp4_block_scales_unit_pair(float amax0, float amax1, float& s0,
                                                             float& s1) {
  uint16_t e8x2;  // s1's code in the high byte, s0's in the low one
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(e8x2) : "f"(nvfp4_div6(amax1)), "f"(nvfp4_div6(amax0)));
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(e8x2));
  asm("cvt.f32.f16 %0, %1;" : "=f"(s0) : "h"(static_cast<uint16_t>(h2 & 0xffffu)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(s1) : "h"(static_cast<uint16_t>(h2 >> 16)));
}

// nvfp4_fake_quant for a block-scale group (dec = 1) of values x >= 0 (softmax probabilities), on
// the device: the same result for every such x, without the sign and second-level steps. A group
// whose scale is 0 has reciprocal 0, so x * 0 = 0 rounds to 0 and 0 * s = 0, as the general form
// returns.
__device__ __forceinline__ float nvfp4_fake_quant_nonneg_block(const Nvfp4Group& g, float x) {
  return e2m1_round_magnitude_fma(x * g.reciprocal) * g.e4m3;
}
#endif

}  // namespace fva
