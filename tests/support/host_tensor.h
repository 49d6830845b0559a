// Host tensors for the numerical tests: an owning, 64-byte aligned buffer plus the fva_tensor_t that
// describes it, in the dtypes the API takes (bf16, f16, f32, i32) and in BHSD or BSHD-permuted
// layouts, with an optional padded row pitch so that strides other than the contiguous ones are
// exercised. Values go in and come out as doubles in logical [B, H, S, D] order, so the tests can
// compare against reference64 directly.
//
// Also here: the error measures of SPEC section 4 (rel_l2, has_nan) and the per-run random seed.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fvattn/fvattn.h>

namespace fvt {

// Physical layout of a rank-4 tensor whose logical shape is [B, H, S, D].
enum class Layout {
  BHSD,  // contiguous [B, H, S, D]
  BSHD,  // memory order [B, S, H, D] (the transformer's natural layout), viewed as BHSD by strides
};

const char* dtype_name(int32_t dtype);
// fvadesc::dtype_size (tools/tensor_desc), but an unknown dtype throws std::invalid_argument: here it
// can only be a bug in the test.
size_t dtype_size(int32_t dtype);

// 64-byte aligned host memory of exactly `bytes` bytes (none when bytes is 0: data() is null).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);
  void* data() const { return ptr_.get(); }
  size_t size() const { return bytes_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> ptr_;
  size_t bytes_ = 0;
};

class HostTensor {
 public:
  HostTensor() = default;
  // shape: the logical shape (rank 1..4). Layout and row_pad apply to rank 4 only: row_pad extra
  // elements follow every D-row in memory (keep it a multiple of 8 for bf16/f16: the API wants 16-byte
  // aligned strides). Memory starts poisoned (every byte 0xFF).
  HostTensor(int32_t dtype, std::vector<int64_t> shape, Layout layout = Layout::BHSD,
             int64_t row_pad = 0);

  const fva_tensor_t* t() const { return &desc_; }
  fva_tensor_t desc() const { return desc_; }
  int32_t dtype() const { return desc_.dtype; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  void* data() const { return buf_.data(); }
  size_t bytes() const { return buf_.size(); }

  // Logical element i (row-major over shape) -> element offset in memory.
  int64_t offset(int64_t i) const;

  // Writes values (logical order, numel of them) rounded to the dtype: round-to-nearest-even for
  // bf16/f16/f32, truncation toward zero for i32 (tests pass integers).
  void fill(const std::vector<double>& values);
  void fill_i32(const std::vector<int32_t>& values);
  // Normal(mean, stddev) values, rounded to the dtype; returns what was stored (as doubles).
  std::vector<double> fill_normal(std::mt19937_64& rng, double mean = 0.0, double stddev = 1.0);
  // Every byte 0xFF: NaN in bf16, f16 and f32, -1 in i32. Outputs are poisoned before each call so
  // that an element the library forgets to write reads NaN and fails.
  void poison();
  // True if no byte outside the logical elements (row padding) changed from 0xFF since construction
  // or poison(): the library wrote nothing it should not have.
  bool padding_intact() const;

  std::vector<double> values() const;      // logical order, exact
  std::vector<int32_t> values_i32() const;  // i32 tensors only
  std::vector<uint16_t> bits16() const;     // bf16/f16 tensors only: raw bit patterns

 private:
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
  AlignedBuffer buf_;
  fva_tensor_t desc_{};
};

// ---- scalar conversions (exact; the rounding itself is reference64's) ----------------------------
uint16_t bf16_bits(double x);  // x rounded to bf16 (RNE), as bits
double bf16_value(uint16_t bits);
uint16_t f16_bits(double x);  // x rounded to binary16 (RNE), as bits
double f16_value(uint16_t bits);

// ---- measures (SPEC section 4) ---------------------------------------------------------------------

// ||a - b|| / ||b||. If ||b|| is 0 it is 0 when a is all zeros and +inf otherwise; NaN anywhere
// makes it NaN (so a `<= tol` check fails).
double rel_l2(const std::vector<double>& a, const std::vector<double>& b);
// rel_l2(got, ref) with ||ref||² floored at 1e-6 per element (1e-3 rms): where the reference is
// exactly 0 (one key: P = 1 and dS cancels to 0 on the CPU, to ~1e-7 on the GPU; dgate where out_c
// is 0), a relative error means nothing. NaN in got makes it NaN (a `<= tol` check fails). The GPU
// suites and the fuzz replay compare the CUDA backend against the CPU backend with it.
double rel_l2_floored(const std::vector<double>& got, const std::vector<double>& ref);
bool has_nan(const std::vector<double>& a);
int64_t count_nan(const std::vector<double>& a);

// ---- random seed ----------------------------------------------------------------------------------

// The run's seed: FVATTN_TEST_SEED from the environment if set, else fresh from std::random_device,
// so every run explores new shapes and values. Printed to stdout the first time it is asked for, so a
// failure can be replayed with FVATTN_TEST_SEED=<seed>.
uint64_t test_seed();

}  // namespace fvt
