// MUFU.RCP on the host: the GPU's approximate reciprocal, from the table the device probe
// tools/lab/rcp_approx_probe.cu measured (an H100; the GPU suite's NVFP4 parity test compares it
// with the device it runs on). The table holds, for each of the 2^23 fractions f, two bits: the
// difference between MUFU.RCP(1 + f 2^-23) and the correctly rounded 1 / (1 + f 2^-23), in ulps
// (0: none, 1: one above, 2: one below). Its file is embedded into the object by the assembler.
#include <cstdint>
#include <cstring>

#include "nvfp4/fastvideo_division.h"

#ifndef FVA_MUFU_RCP_TABLE
#error "FVA_MUFU_RCP_TABLE names the table file (src/nvfp4/CMakeLists.txt)"
#endif

// The table's 2 MiB, in .rodata, between two local symbols.
asm(".section .rodata\n"
    ".balign 64\n"
    "fva_mufu_rcp_table_begin:\n"
    ".incbin \"" FVA_MUFU_RCP_TABLE "\"\n"
    "fva_mufu_rcp_table_end:\n"
    ".previous\n");

extern "C" {
extern const uint8_t fva_mufu_rcp_table_begin[] __asm__("fva_mufu_rcp_table_begin");
extern const uint8_t fva_mufu_rcp_table_end[] __asm__("fva_mufu_rcp_table_end");
}

namespace fva {

size_t mufu_reciprocal_table_bytes() {
  return static_cast<size_t>(fva_mufu_rcp_table_end - fva_mufu_rcp_table_begin);
}

int mufu_reciprocal_table_code(uint32_t fraction) {
  return (fva_mufu_rcp_table_begin[fraction / 4] >> (2 * (fraction % 4))) & 3;
}

float mufu_reciprocal(float y) {
  uint32_t b;
  std::memcpy(&b, &y, 4);
  const uint32_t sign = b & 0x80000000u, exponent = (b >> 23) & 0xFFu, fraction = b & 0x7FFFFFu;
  // Zero, inf and NaN have exact reciprocals: +-inf, +-0, the NaN.
  if (exponent == 0xFFu) {
    if (fraction != 0) return y;
    const uint32_t zero = sign;
    float out;
    std::memcpy(&out, &zero, 4);
    return out;
  }
  if (exponent == 0 && fraction == 0) {
    const uint32_t inf = sign | 0x7F800000u;
    float out;
    std::memcpy(&out, &inf, 4);
    return out;
  }
  // rcp(m) for m = 1 + fraction 2^-23 lies in (1/2, 1]: the correctly rounded one, then the
  // measured step; 2^(127 - exponent) places it (the result is normal for every normal |y| <= 2^126).
  uint32_t m_bits = 0x3F800000u | fraction;
  float m;
  std::memcpy(&m, &m_bits, 4);
  const float exact = 1.0f / m;
  uint32_t r;
  std::memcpy(&r, &exact, 4);
  const int code = mufu_reciprocal_table_code(fraction);
  r += code == 1 ? 1u : 0u;
  r -= code == 2 ? 1u : 0u;
  // rcp(m) 2^-(exponent - 127): the biased exponent field moves by 127 - exponent (unsigned
  // wrap-around subtracts); it stays in [0, 252] for every exponent of the domain.
  r += (127u - exponent) << 23;
  r |= sign;
  float out;
  std::memcpy(&out, &r, 4);
  return out;
}

}  // namespace fva
