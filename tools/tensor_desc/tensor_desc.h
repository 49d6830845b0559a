// fva_tensor_t helpers that the fvattn tool, the tests and the fuzzer share, so that each is written
// once: the size of a dtype's element and the descriptor of a contiguous tensor. Header-only and free
// of any library internals (src/checks.cpp keeps its own): the tests check the library against these,
// not against its own code. Needs only the public header.
#pragma once

#include <fvattn/fvattn.h>

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fvadesc {

// Bytes per element of an FVA_DTYPE_* code; 0 for a code fvattn.h does not define, so that each
// caller decides what an unknown dtype means (the fuzzer's memory model: a tensor the library must
// reject; the tests' HostTensor: a bug in the test).
constexpr size_t dtype_size(int32_t dtype) noexcept {
  switch (dtype) {
    case FVA_DTYPE_BF16:
    case FVA_DTYPE_F16: return 2;
    case FVA_DTYPE_F32:
    case FVA_DTYPE_I32: return 4;
    case FVA_DTYPE_I64: return 8;
    default: return 0;
  }
}

// The descriptor of a contiguous (row-major) tensor of `shape` at `data`: the last stride 1, every
// other one the product of the extents after it. data may be null for a caller that places the
// tensor later (the fuzzer).
inline fva_tensor_t contiguous(void* data, int32_t dtype, const std::vector<int64_t>& shape) {
  assert(shape.size() <= FVA_MAX_RANK);  // shape[] and strides[] hold FVA_MAX_RANK entries
  fva_tensor_t t{};
  t.data = data;
  t.dtype = dtype;
  t.rank = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.shape[i] = shape[static_cast<size_t>(i)];
    t.strides[i] = stride;
    stride *= shape[static_cast<size_t>(i)];
  }
  return t;
}

// The descriptor of a [B, H, S, D] attention tensor at `data` stored BHSD (bshd false) or BSHD (true),
// every row of D elements followed by `pad` unused ones.
inline fva_tensor_t attention_layout(void* data, int32_t dtype, int64_t B, int64_t H, int64_t S, int64_t D,
                                     bool bshd, int64_t pad) {
  fva_tensor_t t{};
  t.data = data;
  t.dtype = dtype;
  t.rank = 4;
  t.shape[0] = B, t.shape[1] = H, t.shape[2] = S, t.shape[3] = D;
  const int64_t row = D + pad;
  t.strides[3] = 1;
  if (bshd) {
    t.strides[1] = row, t.strides[2] = H * row, t.strides[0] = S * H * row;
  } else {
    t.strides[2] = row, t.strides[1] = S * row, t.strides[0] = H * S * row;
  }
  return t;
}

// The bytes a contiguous tensor of `shape` and `dtype` occupies (its elements times dtype_size).
inline size_t contiguous_bytes(int32_t dtype, const std::vector<int64_t>& shape) {
  size_t n = dtype_size(dtype);
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  return n;
}

}  // namespace fvadesc
