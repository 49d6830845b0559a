// FastVideo's fp32 division, bit for bit on the GPU and on the host.
//
// Triton compiles an fp32 `/` to PTX div.full.f32, which every NVIDIA GPU since Ampere runs as
// (nvcc 13's SASS for sm_80 to sm_120):
//     if |y| > 2^126:            x, y scaled by 1/4
//     if !(|y| >= 2^-126):       x, y scaled by 2^24   (subnormal y, zero, NaN)
//     x / y ~= RN(x * MUFU.RCP(y))
// MUFU.RCP, the special-function unit's reciprocal, is within one ulp of 1/y but not correctly
// rounded. For a normal y = +-m 2^e (m in [1, 2)) it is +-rcp(m) 2^-e, rcp a function of m's 23
// fraction bits alone; the host reads rcp from a table measured on the device
// (tools/lab/rcp_approx_probe.cu, src/nvfp4/mufu_reciprocal.cpp), which reproduced div.full.f32 on
// 16.7 million random operand pairs of every class with no difference. NVFP4's tile and row modes
// divide this way (nvfp4.h), so that the CPU backend and every GPU kernel give FastVideo's scales.
#pragma once

#include "nvfp4/float_formats.h"

#include <cstddef>
#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace fva {

#if !defined(__CUDA_ARCH__)
// MUFU.RCP of y, from the measured table, for every y div.full.f32 passes it: a normal y with
// |y| <= 2^126, or zero, inf or NaN (exact: +-inf, +-0, the NaN); host only
// (src/nvfp4/mufu_reciprocal.cpp, the static library fvattn_nvfp4_host).
float mufu_reciprocal(float y);
// The table itself, for its tests: its size in bytes, and fraction f's code (0, 1 or 2, above).
size_t mufu_reciprocal_table_bytes();
int mufu_reciprocal_table_code(uint32_t fraction);
#endif

FVA_HD float fastvideo_div(float x, float y) {
#if defined(__CUDA_ARCH__)
  float q;
  asm("div.full.f32 %0, %1, %2;" : "=f"(q) : "f"(x), "f"(y));
  return q;
#else
  const float ay = std::fabs(y);
  if (ay > 0x1p126f) x *= 0.25f, y *= 0.25f;
  if (!(ay >= 0x1p-126f)) x *= 0x1p24f, y *= 0x1p24f;
  // After the scaling y is normal, or zero, inf or NaN.
  return mufu_reciprocal(y) * x;
#endif
}

}  // namespace fva
