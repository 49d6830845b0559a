#include "support/host_tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>

#include "reference64.h"
#include "tensor_desc.h"

namespace fvt {

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case FVA_DTYPE_BF16: return "bf16";
    case FVA_DTYPE_F16: return "f16";
    case FVA_DTYPE_F32: return "f32";
    case FVA_DTYPE_I32: return "i32";
    case FVA_DTYPE_I64: return "i64";
    default: return "?";
  }
}

size_t dtype_size(int32_t dtype) {
  const size_t n = fvadesc::dtype_size(dtype);
  if (n == 0) throw std::invalid_argument("dtype_size: unknown dtype");
  return n;
}

// ---- AlignedBuffer --------------------------------------------------------------------------------

void AlignedBuffer::Free::operator()(void* p) const { std::free(p); }

AlignedBuffer::AlignedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  // aligned_alloc wants a size that is a multiple of the alignment; the caller still sees `bytes`.
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  ptr_.reset(p);
}

// ---- scalar conversions ------------------------------------------------------------------------------

uint16_t bf16_bits(double x) {
  if (std::isnan(x)) return 0x7FC0;
  // ref64 rounds to a bf16 value; as a float it is exact, and its top 16 bits are the bf16.
  const float f = static_cast<float>(ref64::round_bf16(x));
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

double bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f16_bits(double x) {
  if (std::isnan(x)) return 0x7E00;
  const double r = ref64::round_f16(x);
  const uint16_t sign = std::signbit(r) ? 0x8000 : 0;
  const double a = std::fabs(r);
  if (std::isinf(a)) return sign | 0x7C00;
  if (a == 0.0) return sign;
  int ex = 0;
  std::frexp(a, &ex);  // a = m * 2^ex, m in [0.5, 1)
  const int e = ex - 1;
  if (e < -14) {  // subnormal: a = mant * 2^-24
    return sign | static_cast<uint16_t>(std::ldexp(a, 24));
  }
  const uint16_t mant = static_cast<uint16_t>(std::ldexp(a, 10 - e) - 1024.0);
  return sign | static_cast<uint16_t>((e + 15) << 10) | mant;
}

double f16_value(uint16_t bits) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int e = (bits >> 10) & 0x1F;
  const int m = bits & 0x3FF;
  if (e == 0x1F) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

// ---- HostTensor ---------------------------------------------------------------------------------------

HostTensor::HostTensor(int32_t dtype, std::vector<int64_t> shape, Layout layout, int64_t row_pad)
    : shape_(std::move(shape)) {
  const int rank = static_cast<int>(shape_.size());
  if (rank < 1 || rank > 4) throw std::invalid_argument("HostTensor: rank must be 1..4");
  strides_.assign(rank, 1);
  int64_t extent = 1;  // elements spanned in memory
  if (rank == 4) {
    const int64_t B = shape_[0], H = shape_[1], S = shape_[2], D = shape_[3];
    const int64_t pitch = D + row_pad;
    if (layout == Layout::BHSD) {
      strides_ = {H * S * pitch, S * pitch, pitch, 1};
    } else {
      strides_ = {S * H * pitch, pitch, H * pitch, 1};
    }
    extent = B * H * S * pitch;
  } else {
    const fva_tensor_t c = fvadesc::contiguous(nullptr, dtype, shape_);
    strides_.assign(c.strides, c.strides + rank);
    extent = numel();
  }
  buf_ = AlignedBuffer(static_cast<size_t>(extent) * dtype_size(dtype));
  desc_.data = buf_.data();
  desc_.dtype = dtype;
  desc_.rank = rank;
  for (int i = 0; i < rank; ++i) {
    desc_.shape[i] = shape_[i];
    desc_.strides[i] = strides_[i];
  }
  poison();
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

int64_t HostTensor::offset(int64_t i) const {
  int64_t off = 0;
  for (int d = static_cast<int>(shape_.size()) - 1; d >= 0; --d) {
    off += (i % shape_[d]) * strides_[d];
    i /= shape_[d];
  }
  return off;
}

void HostTensor::fill(const std::vector<double>& v) {
  if (static_cast<int64_t>(v.size()) != numel()) throw std::invalid_argument("HostTensor::fill: size");
  char* base = static_cast<char*>(buf_.data());
  const int32_t dt = desc_.dtype;
  for (int64_t i = 0; i < numel(); ++i) {
    char* p = base + offset(i) * dtype_size(dt);
    if (dt == FVA_DTYPE_BF16) {
      const uint16_t b = bf16_bits(v[i]);
      std::memcpy(p, &b, 2);
    } else if (dt == FVA_DTYPE_F16) {
      const uint16_t b = f16_bits(v[i]);
      std::memcpy(p, &b, 2);
    } else if (dt == FVA_DTYPE_F32) {
      const float f = static_cast<float>(v[i]);
      std::memcpy(p, &f, 4);
    } else if (dt == FVA_DTYPE_I32) {
      const int32_t x = static_cast<int32_t>(v[i]);
      std::memcpy(p, &x, 4);
    } else {
      throw std::invalid_argument("HostTensor::fill: unsupported dtype");
    }
  }
}

void HostTensor::fill_i32(const std::vector<int32_t>& v) {
  if (desc_.dtype != FVA_DTYPE_I32) throw std::invalid_argument("fill_i32 on a non-i32 tensor");
  if (static_cast<int64_t>(v.size()) != numel()) throw std::invalid_argument("fill_i32: size");
  char* base = static_cast<char*>(buf_.data());
  for (int64_t i = 0; i < numel(); ++i) std::memcpy(base + offset(i) * 4, &v[i], 4);
}

std::vector<double> HostTensor::fill_normal(std::mt19937_64& rng, double mean, double stddev) {
  std::normal_distribution<double> dist(mean, stddev);
  std::vector<double> v(static_cast<size_t>(numel()));
  for (double& x : v) x = dist(rng);
  fill(v);
  return values();
}

void HostTensor::poison() {
  if (buf_.size()) std::memset(buf_.data(), 0xFF, buf_.size());
}

bool HostTensor::padding_intact() const {
  const size_t es = dtype_size(desc_.dtype);
  std::vector<char> logical(buf_.size() / es, 0);
  for (int64_t i = 0; i < numel(); ++i) logical[static_cast<size_t>(offset(i))] = 1;
  const unsigned char* base = static_cast<const unsigned char*>(buf_.data());
  for (size_t e = 0; e < logical.size(); ++e) {
    if (logical[e]) continue;
    for (size_t b = 0; b < es; ++b)
      if (base[e * es + b] != 0xFF) return false;
  }
  return true;
}

std::vector<double> HostTensor::values() const {
  std::vector<double> v(static_cast<size_t>(numel()));
  const char* base = static_cast<const char*>(buf_.data());
  const int32_t dt = desc_.dtype;
  for (int64_t i = 0; i < numel(); ++i) {
    const char* p = base + offset(i) * dtype_size(dt);
    if (dt == FVA_DTYPE_BF16 || dt == FVA_DTYPE_F16) {
      uint16_t b;
      std::memcpy(&b, p, 2);
      v[i] = dt == FVA_DTYPE_BF16 ? bf16_value(b) : f16_value(b);
    } else if (dt == FVA_DTYPE_F32) {
      float f;
      std::memcpy(&f, p, 4);
      v[i] = f;
    } else if (dt == FVA_DTYPE_I32) {
      int32_t x;
      std::memcpy(&x, p, 4);
      v[i] = x;
    } else {
      throw std::invalid_argument("HostTensor::values: unsupported dtype");
    }
  }
  return v;
}

std::vector<int32_t> HostTensor::values_i32() const {
  if (desc_.dtype != FVA_DTYPE_I32) throw std::invalid_argument("values_i32 on a non-i32 tensor");
  std::vector<int32_t> v(static_cast<size_t>(numel()));
  const char* base = static_cast<const char*>(buf_.data());
  for (int64_t i = 0; i < numel(); ++i) std::memcpy(&v[i], base + offset(i) * 4, 4);
  return v;
}

std::vector<uint16_t> HostTensor::bits16() const {
  if (dtype_size(desc_.dtype) != 2) throw std::invalid_argument("bits16 on a 4-byte tensor");
  std::vector<uint16_t> v(static_cast<size_t>(numel()));
  const char* base = static_cast<const char*>(buf_.data());
  for (int64_t i = 0; i < numel(); ++i) std::memcpy(&v[i], base + offset(i) * 2, 2);
  return v;
}

// ---- measures -------------------------------------------------------------------------------------

double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) throw std::invalid_argument("rel_l2: sizes differ");
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = a[i] - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  if (std::isnan(num) || std::isnan(den)) return std::numeric_limits<double>::quiet_NaN();
  if (den == 0.0) return num == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

double rel_l2_floored(const std::vector<double>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size()) throw std::invalid_argument("rel_l2_floored: sizes differ");
  if (has_nan(got)) return std::numeric_limits<double>::quiet_NaN();
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  den = std::max(den, 1e-6 * static_cast<double>(ref.size()));
  return std::sqrt(num / den);
}

bool has_nan(const std::vector<double>& a) { return count_nan(a) > 0; }

int64_t count_nan(const std::vector<double>& a) {
  int64_t n = 0;
  for (double x : a) n += std::isnan(x) ? 1 : 0;
  return n;
}

// ---- seed -------------------------------------------------------------------------------------------

uint64_t test_seed() {
  static const uint64_t seed = [] {
    uint64_t s = 0;
    const char* env = std::getenv("FVATTN_TEST_SEED");
    if (env && *env) {
      s = std::strtoull(env, nullptr, 0);
      std::printf("[fvattn tests] seed %llu (from FVATTN_TEST_SEED)\n", static_cast<unsigned long long>(s));
    } else {
      std::random_device rd;
      s = (static_cast<uint64_t>(rd()) << 32) ^ rd();
      std::printf("[fvattn tests] seed %llu (replay with FVATTN_TEST_SEED=%llu)\n",
                  static_cast<unsigned long long>(s), static_cast<unsigned long long>(s));
    }
    std::fflush(stdout);
    return s;
  }();
  return seed;
}

}  // namespace fvt
