// Typed, strided views over the caller's tensors for the CPU backend. The API layer has already
// checked every descriptor (rank, dtype, shape, strides, bounds), so the views do no checking.
#pragma once

#include <cstdint>

#include "../../kernels/nvfp4/float_formats.h"
#include "fvattn/fvattn.h"

namespace fva::cpu {

// x rounded to an attention dtype (bf16 or f16), as a float: what storing x in that dtype keeps.
inline float round_to_dtype(int32_t dtype, float x) {
  return dtype == FVA_DTYPE_BF16 ? round_to_bf16(x) : round_to_f16(x);
}

// An attention tensor [B, H, S, D] of bf16 or f16, read and written as float.
struct AttnView {
  char* data = nullptr;
  int32_t dtype = FVA_DTYPE_BF16;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};  // elements

  static AttnView of(const fva_tensor_t& t) {
    AttnView v;
    v.data = static_cast<char*>(t.data);
    v.dtype = t.dtype;
    for (int i = 0; i < 4; ++i) {
      v.shape[i] = t.shape[i];
      v.stride[i] = t.strides[i];
    }
    return v;
  }

  // Pointer to element (b, h, s, 0); the D elements of a row are contiguous (last stride is 1).
  uint16_t* row(int64_t b, int64_t h, int64_t s) const {
    return reinterpret_cast<uint16_t*>(data) + b * stride[0] + h * stride[1] + s * stride[2];
  }
  float to_float(uint16_t bits) const {
    return dtype == FVA_DTYPE_BF16 ? float_from_bf16_bits(bits) : float_from_f16_bits(bits);
  }
  uint16_t from_float(float x) const {
    return dtype == FVA_DTYPE_BF16 ? bf16_bits_from_float(x) : f16_bits_from_float(x);
  }
  // x rounded to this tensor's dtype, as a float.
  float round(float x) const { return round_to_dtype(dtype, x); }

  // Row (b, h, s) as D floats. The dtype test sits outside the element loop so the conversion loop
  // stays branch-free (and vectorizes).
  void load_row(int64_t b, int64_t h, int64_t s, float* out) const {
    const uint16_t* p = row(b, h, s);
    if (dtype == FVA_DTYPE_BF16) {
      for (int64_t d = 0; d < shape[3]; ++d) out[d] = float_from_bf16_bits(p[d]);
    } else {
      for (int64_t d = 0; d < shape[3]; ++d) out[d] = float_from_f16_bits(p[d]);
    }
  }
  // Row (b, h, s) <- mul * in, each value rounded to the dtype.
  void store_row(int64_t b, int64_t h, int64_t s, const float* in, float mul = 1.0f) const {
    uint16_t* p = row(b, h, s);
    if (dtype == FVA_DTYPE_BF16) {
      for (int64_t d = 0; d < shape[3]; ++d) p[d] = bf16_bits_from_float(in[d] * mul);
    } else {
      for (int64_t d = 0; d < shape[3]; ++d) p[d] = f16_bits_from_float(in[d] * mul);
    }
  }
};

// A strided tensor of rank <= 4 with a fixed element type (float lse, int32 metadata). Indices past
// the tensor's rank are ignored (pass 0).
template <typename T>
struct StridedView {
  T* data = nullptr;
  int rank = 0;
  int64_t shape[4] = {1, 1, 1, 1};
  int64_t stride[4] = {0, 0, 0, 0};

  static StridedView of(const fva_tensor_t& t) {
    StridedView v;
    v.data = static_cast<T*>(t.data);
    v.rank = t.rank;
    for (int i = 0; i < t.rank && i < 4; ++i) {
      v.shape[i] = t.shape[i];
      v.stride[i] = t.strides[i];
    }
    return v;
  }

  T& at(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const {
    return data[i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3]];
  }
};

using F32View = StridedView<float>;
using I32View = StridedView<int32_t>;

}  // namespace fva::cpu
