// kernels/nvfp4/float_formats.h and nvfp4/nvfp4.h (SPEC.md section 1) against independent implementations
// written here from the format definitions: value tables enumerated code by code and searched for the
// nearest value in double (ties to the even code), and frexp/ldexp/nearbyint rounding for bf16/fp16.
// Nothing below reuses the headers' bit tricks, so a mistake in one does not hide in the other.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ios>
#include <limits>
#include <random>
#include <vector>

#include "nvfp4/float_formats.h"
#include "shared/key_order.h"
#include "nvfp4/nvfp4.h"

namespace {

// ---- independent models -----------------------------------------------------------------------------

float float_of_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint32_t bits_of_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// FP8 E4M3 ("fn": no infinities, code 0x7f is NaN) magnitudes indexed by code 0..126: exponent
// bias 7, 3 mantissa bits, subnormals m/8 * 2^-6.
std::vector<double> e4m3_magnitudes() {
  std::vector<double> v;
  for (int code = 0; code <= 126; ++code) {
    const int e = code >> 3, m = code & 7;
    v.push_back(e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7));
  }
  return v;
}

// FP4 E2M1 magnitudes indexed by code 0..7: exponent bias 1, 1 mantissa bit, subnormal 0.5.
std::vector<double> e2m1_magnitudes() {
  std::vector<double> v;
  for (int code = 0; code <= 7; ++code) {
    const int e = code >> 1, m = code & 1;
    v.push_back(e == 0 ? m * 0.5 : std::ldexp(1.0 + m / 2.0, e - 1));
  }
  return v;
}

// The value of `table` nearest to a >= 0, the even code on a tie; beyond the largest value, the
// largest (saturation). Brute force over every code.
double nearest_even(const std::vector<double>& table, double a) {
  if (a >= table.back()) return table.back();  // also keeps huge a from tying in double arithmetic
  int best = 0;
  for (int c = 1; c < static_cast<int>(table.size()); ++c) {
    const double db = std::fabs(table[best] - a), dc = std::fabs(table[c] - a);
    if (dc < db || (dc == db && (c % 2 == 0))) best = c;
  }
  return table[best];
}

// x rounded to nearest even with `mant_bits` significand bits (implicit bit included) and minimum
// normal exponent `emin` (frexp convention: values in [2^(e-1), 2^e)), overflowing to inf past `max`.
double round_float_format(double x, int mant_bits, int emin, double max) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0) return x;
  int e;
  std::frexp(x, &e);
  const double ulp = std::ldexp(1.0, std::max(e, emin) - mant_bits);
  const double q = std::nearbyint(x / ulp) * ulp;  // default rounding mode: ties to even
  if (std::fabs(q) > max) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return q == 0.0 ? std::copysign(0.0, x) : q;
}
double model_bf16(double x) { return round_float_format(x, 8, -125, 3.3895313892515355e38); }
double model_f16(double x) { return round_float_format(x, 11, -13, 65504.0); }

// bf16 / fp16 bit patterns decoded from the format definition.
double decode_bf16(uint16_t b) { return static_cast<double>(float_of_bits(static_cast<uint32_t>(b) << 16)); }
double decode_f16(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 31) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0) v = std::ldexp(m, -24);
  else v = std::ldexp(1024 + m, e - 25);
  return sign ? -v : v;
}

bool same_value(double a, double b) {  // equal including the sign of zero; NaN equals NaN
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

// ---- helpers --------------------------------------------------------------------------------------

// Every bf16 bit pattern as a float: all exponents, both signs, zeros, subnormals, inf and NaN.
template <typename F>
void for_each_bf16(F f) {
  for (uint32_t b = 0; b <= 0xffffu; ++b) f(float_of_bits(b << 16));
}

}  // namespace

// ---- E4M3 ---------------------------------------------------------------------------------------------

TEST_CASE("e4m3_round_magnitude: every bf16 value against a brute-force nearest search") {
  const auto table = e4m3_magnitudes();
  REQUIRE(table.size() == 127);
  REQUIRE(table.back() == 448.0);
  REQUIRE(table[1] == std::ldexp(1.0, -9));
  int mismatches = 0;
  float first_bad = 0.0f;
  for_each_bf16([&](float x) {
    const double a = std::fabs(static_cast<double>(x));
    const double want = std::isnan(x) ? 448.0 : nearest_even(table, a);  // NaN/inf saturate
    const double got = fva::e4m3_round_magnitude(x);
    if (got != want) {
      if (mismatches == 0) first_bad = x;
      ++mismatches;
    }
  });
  INFO("first mismatch at x = " << first_bad);
  CHECK(mismatches == 0);
}

TEST_CASE("e4m3_round_magnitude: random fp32 values, and every midpoint between E4M3 values") {
  const auto table = e4m3_magnitudes();
  std::mt19937 rng(20240611u);
  std::uniform_real_distribution<double> expo(-14.0, 10.0);
  std::uniform_real_distribution<double> unit(1.0, 2.0);
  int mismatches = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = static_cast<float>(std::ldexp(unit(rng), static_cast<int>(expo(rng))));
    if (fva::e4m3_round_magnitude(x) != nearest_even(table, x)) ++mismatches;
  }
  CHECK(mismatches == 0);
  // Midpoints are exact in fp32; each must go to the neighbour with the even code.
  for (size_t c = 0; c + 1 < table.size(); ++c) {
    const float mid = static_cast<float>((table[c] + table[c + 1]) / 2);
    REQUIRE(static_cast<double>(mid) == (table[c] + table[c + 1]) / 2);
    INFO("midpoint between codes " << c << " and " << c + 1 << ": " << mid);
    CHECK(fva::e4m3_round_magnitude(mid) == table[c % 2 == 0 ? c : c + 1]);
    CHECK(fva::e4m3_round_magnitude(-mid) == table[c % 2 == 0 ? c : c + 1]);
  }
}

TEST_CASE("e4m3_round_magnitude: saturation, underflow, specials (SPEC section 1)") {
  CHECK(fva::e4m3_round_magnitude(448.0f) == 448.0f);
  CHECK(fva::e4m3_round_magnitude(464.0f) == 448.0f);  // would be a tie to 480 without satfinite
  CHECK(fva::e4m3_round_magnitude(1.0e30f) == 448.0f);
  CHECK(fva::e4m3_round_magnitude(std::numeric_limits<float>::infinity()) == 448.0f);
  CHECK(fva::e4m3_round_magnitude(-std::numeric_limits<float>::infinity()) == 448.0f);
  CHECK(fva::e4m3_round_magnitude(std::numeric_limits<float>::quiet_NaN()) == 448.0f);
  // Smallest subnormal 2^-9; 2^-10 is the tie between 0 and it and goes to 0 (even code).
  CHECK(fva::e4m3_round_magnitude(std::ldexp(1.0f, -9)) == std::ldexp(1.0f, -9));
  CHECK(fva::e4m3_round_magnitude(std::ldexp(1.0f, -10)) == 0.0f);
  CHECK(fva::e4m3_round_magnitude(std::nextafter(std::ldexp(1.0f, -10), 1.0f)) == std::ldexp(1.0f, -9));
  CHECK(fva::e4m3_round_magnitude(std::ldexp(1.0f, -30)) == 0.0f);
  CHECK(fva::e4m3_round_magnitude(0.0f) == 0.0f);
  CHECK(fva::e4m3_round_magnitude(-0.0f) == 0.0f);
  // A few hand-checked normal roundings: 1.0625 is the tie between 1 and 1.125 -> 1 (even).
  CHECK(fva::e4m3_round_magnitude(1.0625f) == 1.0f);
  CHECK(fva::e4m3_round_magnitude(1.1875f) == 1.25f);  // tie between 1.125 (odd) and 1.25 (even)
  CHECK(fva::e4m3_round_magnitude(-3.3f) == 3.25f);
}

// ---- E2M1 ---------------------------------------------------------------------------------------------

TEST_CASE("e2m1_round: every bf16 value against a brute-force nearest search, sign kept") {
  const auto table = e2m1_magnitudes();
  REQUIRE(table == std::vector<double>{0, 0.5, 1, 1.5, 2, 3, 4, 6});
  int mismatches = 0;
  float first_bad = 0.0f;
  for_each_bf16([&](float x) {
    const double mag = std::isnan(x) ? 6.0 : nearest_even(table, std::fabs(static_cast<double>(x)));
    const double want = std::signbit(x) ? -mag : mag;
    if (!same_value(fva::e2m1_round(x), want)) {
      if (mismatches == 0) first_bad = x;
      ++mismatches;
    }
  });
  INFO("first mismatch at x = " << first_bad);
  CHECK(mismatches == 0);
}

TEST_CASE("e2m1_round: the ties SPEC section 1 lists, saturation and specials") {
  struct Tie {
    float in, out;
  };
  // 0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4 (SPEC), and the other midpoints of the grid.
  const Tie ties[] = {{0.25f, 0.0f}, {0.75f, 1.0f}, {1.25f, 1.0f}, {1.75f, 2.0f},
                      {2.5f, 2.0f},  {3.5f, 4.0f},  {5.0f, 4.0f}};
  for (const Tie& t : ties) {
    INFO("tie " << t.in);
    CHECK(fva::e2m1_round(t.in) == t.out);
    CHECK(fva::e2m1_round(-t.in) == -t.out);
    // Just off the tie, the nearest value wins.
    CHECK(fva::e2m1_round(std::nextafter(t.in, 0.0f)) <= t.in);
    CHECK(fva::e2m1_round(std::nextafter(t.in, 100.0f)) >= t.in);
  }
  CHECK(fva::e2m1_round(std::nextafter(0.25f, 1.0f)) == 0.5f);
  CHECK(fva::e2m1_round(std::nextafter(5.0f, 10.0f)) == 6.0f);
  CHECK(fva::e2m1_round(6.0f) == 6.0f);
  CHECK(fva::e2m1_round(7.0f) == 6.0f);
  CHECK(fva::e2m1_round(1.0e38f) == 6.0f);
  CHECK(fva::e2m1_round(-1.0e38f) == -6.0f);
  CHECK(fva::e2m1_round(std::numeric_limits<float>::infinity()) == 6.0f);
  CHECK(fva::e2m1_round(-std::numeric_limits<float>::infinity()) == -6.0f);
  CHECK(std::fabs(fva::e2m1_round(std::numeric_limits<float>::quiet_NaN())) == 6.0f);
  // Sign of zero follows the input.
  CHECK(same_value(fva::e2m1_round(0.0f), 0.0));
  CHECK(same_value(fva::e2m1_round(-0.0f), -0.0));
  CHECK(same_value(fva::e2m1_round(-0.1f), -0.0));
  CHECK(same_value(fva::e2m1_round(-0.25f), -0.0));
}

TEST_CASE("the GPU kernels' E2M1 forms (fp32 FMA, bf16 rounded to odd) equal the ladder for every float") {
  // Every float from 2^-3 to 8 (where the rounding has a choice to make, 50M patterns), every
  // 97th pattern elsewhere up to inf (below 2^-3 both give 0, above 8 both saturate), and the ties.
  // NaN is left to the device parity test: x86's fminf keeps a signaling NaN that the GPU's drops.
  // e2m1_round_magnitude_bf16_odd is the algorithm of the device's packed e2m1_round_scale_bf16x2.
  long mismatches = 0, odd_mismatches = 0;
  uint32_t first_bad = 0, first_odd_bad = 0;
  auto check = [&](uint32_t bits) {
    const float a = fva::bits_float(bits);
    const uint32_t want = fva::float_bits(fva::e2m1_round(a));
    if (fva::float_bits(fva::e2m1_round_magnitude_fma(a)) != want) {
      if (mismatches == 0) first_bad = bits;
      ++mismatches;
    }
    if (fva::float_bits(fva::e2m1_round_magnitude_bf16_odd(a)) != want) {
      if (odd_mismatches == 0) first_odd_bad = bits;
      ++odd_mismatches;
    }
  };
  const uint32_t lo = fva::float_bits(0.125f), hi = fva::float_bits(8.0f);
  for (uint32_t b = lo; b <= hi; ++b) check(b);
  for (uint64_t b = 0; b <= 0x7f800000u; b += 97) check(static_cast<uint32_t>(b));
  for (float t : {0.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f, 1.0e38f,
                  std::numeric_limits<float>::infinity()})
    check(fva::float_bits(t));
  INFO("fp32 form: first mismatch at a = " << fva::bits_float(first_bad));
  CHECK(mismatches == 0);
  INFO("bf16 form: first mismatch at a = " << fva::bits_float(first_odd_bad));
  CHECK(odd_mismatches == 0);
}

TEST_CASE("bf16 rounded to odd: the kept bits, and the lowest set exactly when bits were dropped") {
  CHECK(fva::bf16_bits_round_to_odd(1.0f) == 0x3f80u);
  CHECK(fva::bf16_bits_round_to_odd(fva::bits_float(0x3f800001u)) == 0x3f81u);
  CHECK(fva::bf16_bits_round_to_odd(fva::bits_float(0x3f81ffffu)) == 0x3f81u);
  CHECK(fva::bf16_bits_round_to_odd(fva::bits_float(0x3f820000u)) == 0x3f82u);
  CHECK(fva::bf16_bits_round_to_odd(0.25f) == 0x3e80u);  // a tie stays a tie only when exact
  CHECK(fva::bf16_bits_round_to_odd(std::nextafter(0.25f, 1.0f)) == 0x3e81u);
  CHECK(fva::e2m1_round_magnitude_bf16_odd(std::nextafter(0.25f, 1.0f)) == 0.5f);
  CHECK(fva::e2m1_round_magnitude_bf16_odd(std::nextafter(5.0f, 10.0f)) == 6.0f);
  CHECK(fva::e2m1_round_magnitude_bf16_odd(5.0f) == 4.0f);
}

// ---- bf16 / fp16 ----------------------------------------------------------------------------------------

TEST_CASE("bf16: every bit pattern decodes exactly and round-trips") {
  int mismatches = 0;
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = fva::float_from_bf16_bits(bits);
    const double want = decode_bf16(bits);
    bool ok = same_value(f, want);
    const uint16_t back = fva::bf16_bits_from_float(f);
    if (std::isnan(f)) {
      // NaN stays NaN (quiet), with its sign.
      ok = ok && (back & 0x7f80u) == 0x7f80u && (back & 0x0040u) && (back & 0x8000u) == (bits & 0x8000u);
    } else {
      ok = ok && back == bits;
    }
    mismatches += !ok;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bf16: round to nearest even on random floats and on exact ties") {
  std::mt19937 rng(7u);
  int mismatches = 0;
  uint32_t first_bad = 0;
  auto check = [&](float x) {
    const double want = model_bf16(static_cast<double>(x));
    const double got = fva::round_to_bf16(x);
    if (!same_value(got, want)) {
      if (mismatches == 0) first_bad = bits_of_float(x);
      ++mismatches;
    }
  };
  for (int i = 0; i < 1000000; ++i) {
    const float x = float_of_bits(rng());
    if (!std::isnan(x)) check(x);
  }
  // Exact midpoints between neighbouring bf16 values (the low 16 bits are 0x8000), and one ulp of
  // fp32 either side of them.
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = (rng() & 0xffff0000u) | 0x8000u;
    const float x = float_of_bits(u);
    if (std::isnan(x) || std::isinf(x)) continue;
    check(x);
    check(float_of_bits(u + 1));
    check(float_of_bits(u - 1));
  }
  INFO("first mismatch at fp32 bits 0x" << std::hex << first_bad);
  CHECK(mismatches == 0);
  // Hand-checked: 1 + 2^-8 is the tie between 1 and 1 + 2^-7 -> 1; 1 + 3*2^-8 -> 1 + 2^-6.
  CHECK(fva::round_to_bf16(1.00390625f) == 1.0f);
  CHECK(fva::round_to_bf16(1.01171875f) == 1.015625f);
  CHECK(std::isinf(fva::round_to_bf16(3.4e38f)));
  CHECK(fva::round_to_bf16(3.3895313892515355e38f) == 3.3895313892515355e38f);
}

TEST_CASE("fp16: every bit pattern decodes exactly and round-trips") {
  int mismatches = 0;
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = fva::float_from_f16_bits(bits);
    const double want = decode_f16(bits);
    bool ok = same_value(f, want);
    const uint16_t back = fva::f16_bits_from_float(f);
    if (std::isnan(want)) {
      ok = ok && (back & 0x7c00u) == 0x7c00u && (back & 0x03ffu) != 0;
    } else {
      ok = ok && back == bits;
    }
    mismatches += !ok;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("fp16: round to nearest even on random floats, ties, subnormals and overflow") {
  std::mt19937 rng(11u);
  std::uniform_int_distribution<int> expo(-30, 17);
  std::uniform_real_distribution<double> unit(1.0, 2.0);
  int mismatches = 0;
  float first_bad = 0.0f;
  auto check = [&](float x) {
    const double want = model_f16(static_cast<double>(x));
    const double got = fva::round_to_f16(x);
    if (!same_value(got, want)) {
      if (mismatches == 0) first_bad = x;
      ++mismatches;
    }
  };
  for (int i = 0; i < 1000000; ++i) {
    const double mag = std::ldexp(unit(rng), expo(rng));
    check(static_cast<float>(rng() & 1u ? -mag : mag));
  }
  // Midpoints between every pair of neighbouring finite fp16 values (exact in fp32), and the fp32
  // values just around them.
  for (uint32_t b = 0; b < 0x7bffu; ++b) {
    const double lo = decode_f16(static_cast<uint16_t>(b)), hi = decode_f16(static_cast<uint16_t>(b + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    check(mid);
    check(-mid);
    check(std::nextafter(mid, 0.0f));
    check(std::nextafter(mid, 1.0e6f));
  }
  INFO("first mismatch at x = " << first_bad);
  CHECK(mismatches == 0);
  CHECK(fva::round_to_f16(65504.0f) == 65504.0f);
  CHECK(fva::round_to_f16(65519.0f) == 65504.0f);
  CHECK(std::isinf(fva::round_to_f16(65520.0f)));  // the tie past the largest value goes to inf
  CHECK(fva::round_to_f16(std::ldexp(1.0f, -24)) == std::ldexp(1.0f, -24));
  CHECK(same_value(fva::round_to_f16(std::ldexp(1.0f, -25)), 0.0));  // tie with 0 -> 0
  CHECK(same_value(fva::round_to_f16(-std::ldexp(1.0f, -26)), -0.0));
  CHECK(fva::round_to_f16(std::ldexp(1.5f, -25)) == std::ldexp(1.0f, -24));
  CHECK(std::isnan(fva::round_to_f16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isinf(fva::round_to_f16(-std::numeric_limits<float>::infinity())));
}

// ---- NVFP4 groups ---------------------------------------------------------------------------------------

namespace {

// One group of 16 fake-quantized as SPEC section 1 writes it, in block mode (enc = dec = 1) and
// rounded to bf16: s = e4m3(amax / 6) with amax / 6 an fp32 division; r = 1 / s in fp32;
// y = x * r in fp32; x_q = e2m1(y) * s, exact (at most 2 + 4 significant bits), then bf16.
void model_block_group(const float* x, double* out) {
  static const auto e4 = e4m3_magnitudes();
  static const auto e2 = e2m1_magnitudes();
  double amax = 0.0;
  for (int i = 0; i < 16; ++i)
    if (!std::isnan(x[i])) amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
  const float arg = static_cast<float>(amax) / 6.0f;
  const double s = std::isinf(arg) ? 448.0 : nearest_even(e4, arg);
  for (int i = 0; i < 16; ++i) {
    if (s == 0.0) {
      out[i] = 0.0;
      continue;
    }
    const float r = 1.0f / static_cast<float>(s);
    const float y = x[i] * r;
    const double mag = std::isnan(y) ? 6.0 : nearest_even(e2, std::fabs(static_cast<double>(y)));
    out[i] = model_bf16((std::signbit(y) ? -mag : mag) * s);
  }
}

double header_block_value(const float* x, int i) {
  float amax = 0.0f;
  for (int j = 0; j < 16; ++j) amax = fva::nvfp4_amax_step(amax, x[j]);
  const fva::Nvfp4Group g = fva::nvfp4_block_group(amax);
  return fva::round_to_bf16(fva::nvfp4_fake_quant(g, x[i]));
}

}  // namespace

TEST_CASE("nvfp4 block mode: random groups against the model, bit for bit") {
  std::mt19937 rng(3u);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-16, 12);
  int mismatches = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    float x[16];
    const int e = expo(rng);  // spread group magnitudes over (and past) the E4M3 scale range
    for (float& v : x) v = fva::round_to_bf16(std::ldexp(normal(rng), e));
    if (trial % 7 == 0) x[trial % 16] = fva::round_to_bf16(std::ldexp(normal(rng), e + 4));  // an outlier
    double want[16];
    model_block_group(x, want);
    for (int i = 0; i < 16; ++i) mismatches += !same_value(header_block_value(x, i), want[i]);
  }
  CHECK(mismatches == 0);
}

TEST_CASE("nvfp4: every E2M1 tie under every E4M3 scale goes through the fp32 reciprocal") {
  // x = t * s for a tie t of the E2M1 grid: x / s would be exactly the tie, x * fl(1/s) may land a
  // hair off it; SPEC says multiply by the reciprocal. The model does exactly that.
  const auto e4 = e4m3_magnitudes();
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  int mismatches = 0;
  for (size_t c = 1; c < e4.size(); ++c) {
    const float s = static_cast<float>(e4[c]);
    for (float t : ties) {
      float x[16] = {};
      x[0] = 6.0f * s;  // pins the group's amax so its scale is s
      x[1] = t * s;     // exact in fp32
      x[2] = -t * s;
      double want[16];
      model_block_group(x, want);
      for (int i = 0; i < 16; ++i) mismatches += !same_value(header_block_value(x, i), want[i]);
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("nvfp4: groups whose scale rounds to 0 decode to exact zeros, never NaN") {
  float zeros[16] = {};
  const fva::Nvfp4Group gz = fva::nvfp4_block_group(0.0f);
  CHECK(gz.e4m3 == 0.0f);
  CHECK(gz.reciprocal == 0.0f);
  for (float v : zeros) CHECK(same_value(fva::nvfp4_fake_quant(gz, v), 0.0));
  // amax / 6 at or below 2^-10 rounds the scale to 0 (SPEC: amax*enc/6 < 2^-10 gives zeros).
  const float tiny = 6.0f * std::ldexp(1.0f, -10);
  const fva::Nvfp4Group gt = fva::nvfp4_block_group(tiny);
  CHECK(gt.e4m3 == 0.0f);
  CHECK(same_value(fva::nvfp4_fake_quant(gt, tiny), 0.0));
  CHECK(same_value(fva::nvfp4_fake_quant(gt, -tiny), 0.0));
  // Tile mode on an all-zero tile: the floored amax keeps enc finite, the scale is 0, no NaN.
  const fva::Nvfp4SecondLevel floor_level = fva::nvfp4_second_level(0.0f);
  CHECK(std::isfinite(floor_level.enc));
  CHECK(floor_level.enc == fva::fastvideo_div(fva::kNvfp4SecondLevelTarget, fva::kNvfp4AmaxFloor));
  const fva::Nvfp4Group g0 = fva::nvfp4_group(0.0f, floor_level);
  CHECK(same_value(fva::nvfp4_fake_quant(g0, 0.0f), 0.0));
  CHECK(same_value(fva::nvfp4_fake_quant(g0, -0.0f), 0.0));
  // Just above the threshold the scale is the smallest subnormal and values survive.
  const float small = 6.0f * std::ldexp(1.0f, -9);
  const fva::Nvfp4Group gs = fva::nvfp4_block_group(small);
  CHECK(gs.e4m3 == std::ldexp(1.0f, -9));
  CHECK(fva::nvfp4_fake_quant(gs, small) == small);
}

TEST_CASE("nvfp4: sign of zero, NaN and inf inputs, the amax ignores NaN") {
  float x[16];
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i) - 7.5f;  // amax 7.5
  float amax = 0.0f;
  for (float v : x) amax = fva::nvfp4_amax_step(amax, v);
  CHECK(amax == 7.5f);
  CHECK(fva::nvfp4_amax_step(amax, std::numeric_limits<float>::quiet_NaN()) == 7.5f);
  CHECK(fva::nvfp4_amax_step(amax, -8.0f) == 8.0f);
  const fva::Nvfp4Group g = fva::nvfp4_block_group(amax);
  CHECK(g.e4m3 == 1.25f);  // e4m3(7.5 / 6) = 1.25 exactly
  // A value far below the scale quantizes to a zero with its own sign.
  CHECK(same_value(fva::nvfp4_fake_quant(g, -0.01f), -0.0));
  CHECK(same_value(fva::nvfp4_fake_quant(g, 0.01f), 0.0));
  CHECK(same_value(fva::nvfp4_fake_quant(g, -0.0f), -0.0));
  // NaN and inf saturate to +-6 times the scale (SPEC: Inf/NaN inputs saturate to +-6).
  CHECK(fva::nvfp4_fake_quant(g, std::numeric_limits<float>::infinity()) == 7.5f);
  CHECK(fva::nvfp4_fake_quant(g, -std::numeric_limits<float>::infinity()) == -7.5f);
  CHECK(std::fabs(fva::nvfp4_fake_quant(g, std::numeric_limits<float>::quiet_NaN())) == 7.5f);
  // A NaN takes its own sign bit (the GPU's x * r would return a canonical, positive NaN).
  CHECK(fva::nvfp4_fake_quant(g, std::numeric_limits<float>::quiet_NaN()) == 7.5f);
  CHECK(fva::nvfp4_fake_quant(g, -std::numeric_limits<float>::quiet_NaN()) == -7.5f);
  // A group holding an infinity gets the largest scale, 448, and every finite value stays finite.
  const fva::Nvfp4Group gi = fva::nvfp4_block_group(std::numeric_limits<float>::infinity());
  CHECK(gi.e4m3 == 448.0f);
  CHECK(fva::nvfp4_fake_quant(gi, 1.0f) == 0.0f);
}

TEST_CASE("nvfp4 tile mode: enc, dec and the decode follow the header's fp32 contract") {
  // Tile mode: s = e4m3(amax / 6 * enc), r = 1 / fl(s * dec), every division FastVideo's (div), and
  // nvfp4_fake_quant returns fl(fl(e2m1(x * r) * s) * dec) in fp32 (callers then round to the
  // dtype); e2m1 * s is exact.
  const auto div = [](float a, float b) { return fva::fastvideo_div(a, b); };
  const auto e4 = e4m3_magnitudes();
  const auto e2 = e2m1_magnitudes();
  std::mt19937 rng(5u);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  int mismatches = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    float x[16];
    for (float& v : x) v = fva::round_to_bf16(normal(rng));
    float tile_amax = 0.0f, amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    tile_amax = amax * (1.0f + static_cast<float>(trial % 5));  // this group is not always the tile's max
    const float enc = div(2688.0f, tile_amax), dec = div(1.0f, enc);
    const fva::Nvfp4SecondLevel second = fva::nvfp4_second_level(tile_amax);
    CHECK(second.tile);
    CHECK(second.enc == enc);
    CHECK(second.dec == dec);
    const double s = nearest_even(e4, div(amax, 6.0f) * enc);
    const float scale = static_cast<float>(s) * dec;
    const fva::Nvfp4Group g = fva::nvfp4_group(amax, second);
    mismatches += g.e4m3 != static_cast<float>(s) || g.dec != dec || g.reciprocal != div(1.0f, scale);
    for (float v : x) {
      const float y = v * div(1.0f, scale);
      const double mag = nearest_even(e2, std::fabs(static_cast<double>(y)));
      const double exact_es = (std::signbit(y) ? -mag : mag) * s;  // exact in double and in fp32
      const float want = static_cast<float>(exact_es) * dec;
      mismatches += !same_value(fva::nvfp4_fake_quant(g, v), want);
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("the owned-group key order: a bijection of 64 keys, each NVFP4 group in one quad lane") {
  // A wgmma accumulator's lane t holds columns 8j + 2t + e (j = 0..7, e = 0, 1): in slot order,
  // those must be exactly the 16 keys of group t, and the inverse must undo the order.
  std::vector<int> seen(fva::kOwnedTileKeys, 0);
  for (int key = 0; key < fva::kOwnedTileKeys; ++key) {
    const int slot = fva::owned_slot_of_key(key);
    REQUIRE(slot >= 0);
    REQUIRE(slot < fva::kOwnedTileKeys);
    ++seen[slot];
    CHECK(fva::key_of_owned_slot(slot) == key);
  }
  CHECK(std::count(seen.begin(), seen.end(), 1) == fva::kOwnedTileKeys);
  for (int t = 0; t < 4; ++t)
    for (int j = 0; j < 8; ++j)
      for (int e = 0; e < 2; ++e) CHECK(fva::key_of_owned_slot(8 * j + 2 * t + e) / 16 == t);
}

TEST_CASE("FastVideo's division on the host: the measured MUFU.RCP table and div.full.f32's ranges") {
  // The embedded table as measured: 2 bits for each of 2^23 fractions, and how many are off by one
  // ulp either way (the probe's counts: a checksum of the data, not a property of division).
  REQUIRE(fva::mufu_reciprocal_table_bytes() == (size_t{1} << 21));
  long long count[4] = {0, 0, 0, 0};
  for (uint32_t f = 0; f < (1u << 23); ++f) ++count[fva::mufu_reciprocal_table_code(f)];
  CHECK(count[0] == 7280086);
  CHECK(count[1] == 733799);
  CHECK(count[2] == 374723);
  CHECK(count[3] == 0);

  // Within one ulp of the exact reciprocal, sign and exponent applied (PTX: rcp.approx.f32's error
  // is at most one ulp), and exact at powers of two.
  std::mt19937 rng(11u);
  std::uniform_int_distribution<uint32_t> fraction(0, (1u << 23) - 1);
  std::uniform_int_distribution<int> exponent(1, 252);  // |y| < 2^126
  for (int i = 0; i < 100000; ++i) {
    const uint32_t bits = (static_cast<uint32_t>(exponent(rng)) << 23) | fraction(rng) | (i % 2 ? 0x80000000u : 0u);
    float y;
    std::memcpy(&y, &bits, 4);
    const double exact = 1.0 / static_cast<double>(y);
    const float r = fva::mufu_reciprocal(y);
    const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
    REQUIRE(std::fabs(static_cast<double>(r) - exact) <= ulp);
  }
  CHECK(fva::mufu_reciprocal(0x1p126f) == 0x1p-126f);
  CHECK(fva::mufu_reciprocal(-0x1p-126f) == -0x1p126f);
  CHECK(fva::mufu_reciprocal(1.0f) == 1.0f);

  // div.full.f32's ranges: |y| > 2^126 and subnormal y are scaled by 1/4 and 2^24 first; zero, inf
  // and NaN divide as IEEE says.
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(fva::fastvideo_div(0x1p127f, 0x1p127f) == 1.0f);
  CHECK(fva::fastvideo_div(1.0f, 0x1p127f) == 0x1p-127f);  // a subnormal quotient
  CHECK(fva::fastvideo_div(0x1p-140f, 0x1p-140f) == 1.0f);
  CHECK(fva::fastvideo_div(1.0f, 0.0f) == inf);
  CHECK(fva::fastvideo_div(-1.0f, 0.0f) == -inf);
  CHECK(std::isnan(fva::fastvideo_div(0.0f, 0.0f)));
  CHECK(fva::fastvideo_div(5.0f, inf) == 0.0f);
  CHECK(std::isnan(fva::fastvideo_div(inf, inf)));
  CHECK(std::isnan(fva::fastvideo_div(1.0f, std::numeric_limits<float>::quiet_NaN())));
  // Within two ulps of the correctly rounded quotient over NVFP4's ranges (PTX: div.full.f32's bound).
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> e(-30, 30);
  for (int i = 0; i < 100000; ++i) {
    const float x = std::ldexp(mant(rng), e(rng)), y = std::ldexp(mant(rng), e(rng));
    const float q = fva::fastvideo_div(x, y), exact = x / y;
    const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
    REQUIRE(std::fabs(static_cast<double>(q) - static_cast<double>(exact)) <= 2 * ulp);
  }
}
