// What the VSA layer's kernels (kernels/vsa_layer/, SPEC section 3b) share: 16-bit element access
// as raw bits with the dtype's rounding, the check of the reserve's record, and the fixed-order fp32
// step of the sums that do not run on tensor cores.
//
// Rounding: every tensor the layer's torch original materializes is rounded to the dtype where
// torch rounds it (SPEC 3b); sums run in fp32 in a fixed order (the coarse products on tensor cores,
// the rest with step() below; no atomics on floats), so every result is the same on every run.
#pragma once

#include <stdint.h>

#include "primitives/block_terms.cuh"  // reserve_matches
#include "primitives/kernel_chain.cuh"
#include "primitives/sm80.cuh"
#include "shared/vsa_layer_params.h"

namespace fva::dev::layer {

// ---- elements as bits ------------------------------------------------------------------------------

template <typename T>
struct Elem;
template <>
struct Elem<Bf16> {
  static constexpr uint32_t kInfBits = 0x7f80u;  // above it (sign cleared): NaN
  static __device__ __forceinline__ uint16_t bits(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
  static __device__ __forceinline__ float value(uint16_t b) {
    return __uint_as_float(static_cast<uint32_t>(b) << 16);
  }
};
template <>
struct Elem<F16> {
  static constexpr uint32_t kInfBits = 0x7c00u;
  static __device__ __forceinline__ uint16_t bits(float x) {
    return __half_as_ushort(__float2half_rn(x));
  }
  static __device__ __forceinline__ float value(uint16_t b) {
    return __half2float(__ushort_as_half(b));
  }
};

// x rounded to the dtype, as a float.
template <typename T>
__device__ __forceinline__ float rnd(float x) {
  return Elem<T>::value(Elem<T>::bits(x));
}

// The two elements of a 32-bit word (low first) and back.
template <typename T>
__device__ __forceinline__ float lo(uint32_t w) {
  return Elem<T>::value(static_cast<uint16_t>(w & 0xffffu));
}
template <typename T>
__device__ __forceinline__ float hi(uint32_t w) {
  return Elem<T>::value(static_cast<uint16_t>(w >> 16));
}
template <typename T>
__device__ __forceinline__ uint32_t pack(float l, float h) {
  return static_cast<uint32_t>(Elem<T>::bits(l)) | (static_cast<uint32_t>(Elem<T>::bits(h)) << 16);
}

// 8 elements (16 bytes) <-> floats.
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = lo<T>(w[i]);
    f[2 * i + 1] = hi<T>(w[i]);
  }
}
template <typename T>
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  return make_uint4(pack<T>(f[0], f[1]), pack<T>(f[2], f[3]), pack<T>(f[4], f[5]),
                    pack<T>(f[6], f[7]));
}

// SPEC 3b step 5 for one element: out = dtype(dtype(out_c * gate) + out_s), torch's two roundings
// (a product, then a sum, each a tensor in the dtype; the caller rounds the sum as it packs it);
// without a gate dtype(out_c + out_s). The gate pass (gate.cu) and the sm_90a VSA forward's fused
// epilogue (sm90/fused_layer_gate.cuh) both compute out with it.
template <typename T>
__device__ __forceinline__ float gate_combine(float out_c, float out_s, float gate, bool gated) {
  return gated ? rnd<T>(out_c * gate) + out_s : out_c + out_s;
}

// The same for 8 elements (16 bytes; gate null: no gate) ...
template <typename T>
__device__ __forceinline__ uint4 gate_combine8(const float (&oc)[8], const uint4& out_s,
                                               const uint4* gate) {
  const bool gated = gate != nullptr;
  float os[8], gt[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, o[8];
  unpack8<T>(out_s, os);
  if (gated) unpack8<T>(*gate, gt);
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = gate_combine<T>(oc[e], os[e], gt[e], gated);
  return pack8<T>(o);
}

// ... and for a pair of them (32-bit words of out_c, out_s and the gate, low element first).
template <typename T>
__device__ __forceinline__ uint32_t gate_combine2(uint32_t out_c, uint32_t out_s, uint32_t gate,
                                                  bool gated) {
  return pack<T>(gate_combine<T>(lo<T>(out_c), lo<T>(out_s), lo<T>(gate), gated),
                 gate_combine<T>(hi<T>(out_c), hi<T>(out_s), hi<T>(gate), gated));
}

// The elements of a [B, H, S, D] view at (b, h, s), as 16-bit words.
__device__ __forceinline__ const uint16_t* row_of(const kern::Tensor4& t, int b, int h, int64_t s) {
  return static_cast<const uint16_t*>(t.data) + b * t.stride_b + h * t.stride_h + s * t.stride_s;
}
__device__ __forceinline__ uint16_t* mutable_row_of(const kern::Tensor4& t, int b, int h, int64_t s) {
  return static_cast<uint16_t*>(t.data) + b * t.stride_b + h * t.stride_h + s * t.stride_s;
}

// A real-token count read under the metadata rules (src/cpu/vsa_common.h): clamped to [0, 64].
__device__ __forceinline__ int block_tokens(const int32_t* sizes, int64_t stride, int i) {
  return min(max(sizes[i * stride], 0), 64);
}

// ---- the fixed-order step of the sums off the tensor cores ------------------------------------------

// acc + a * b, rounded once (an FMA). The softmax's sums and the per-block passes' sums add their
// terms one at a time in ascending order of their index with this step, as the CPU backend does.
__device__ __forceinline__ float step(float acc, float a, float b) { return __fmaf_rn(a, b, acc); }

}  // namespace fva::dev::layer
