// The sm_80-class instructions every portable kernel is built from: cp.async copies into shared
// memory, ldmatrix fragment loads and the m16n8k16 tensor-core MMA with fp32 accumulators. Thin
// wrappers, one instruction each, so the kernels read as tile algebra.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with lane = 4 * g + t:
//   A (16x16, row-major):  a[0] = (row g,   k 2t..2t+1)  a[1] = (row g+8, k 2t..2t+1)
//                          a[2] = (row g,   k 2t+8..+9)  a[3] = (row g+8, k 2t+8..+9)
//   B (16x8, k x n):       b[0] = (k 2t..2t+1, col g)    b[1] = (k 2t+8..+9, col g)
//   C (16x8, fp32):        c[0..1] = (row g, cols 2t, 2t+1), c[2..3] = (row g+8, same cols)
// so a row of C is spread over the 4 lanes of a quad and a column over the 8 quads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace fva::dev {

// ---- element types ----------------------------------------------------------------------------

// The two tensor dtypes: how to pack two fp32 values into the 32-bit MMA operand register.
struct Bf16 {
  using Storage = __nv_bfloat16;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float round(float x) {
    return __bfloat162float(__float2bfloat16_rn(x));
  }
  static __device__ __forceinline__ float to_float(Storage x) { return __bfloat162float(x); }
  // The two values of a packed pair, exactly.
  static __device__ __forceinline__ float low(uint32_t v) { return __uint_as_float(v << 16); }
  static __device__ __forceinline__ float high(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
};

struct F16 {
  using Storage = __half;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float round(float x) { return __half2float(__float2half_rn(x)); }
  static __device__ __forceinline__ float to_float(Storage x) { return __half2float(x); }
  static __device__ __forceinline__ float low(uint32_t v) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(v & 0xffffu)));
  }
  static __device__ __forceinline__ float high(uint32_t v) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(v >> 16)));
  }
};

// d += a * b, m16n8k16, fp32 accumulate.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<Bf16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<F16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The two 16-bit pairs of accumulator tile j (n8 tile j of an m16 row block: row_g its row g's
// two values, row_g8 row g + 8's) as their half of the A fragment of k16 step j / 2 (columns 0-7
// of the step for even j, 8-15 for odd j): how a product's output (P, dS) becomes the A operand of
// the next product.
template <int M>
__device__ __forceinline__ void set_a_tile(uint32_t (&a)[M][4], int j, uint32_t row_g,
                                           uint32_t row_g8) {
  a[j / 2][(j & 1) * 2 + 0] = row_g;
  a[j / 2][(j & 1) * 2 + 1] = row_g8;
}

// Accumulator tile j (c[0..1] row g, c[2..3] row g + 8) packed to T into the A fragment
// (set_a_tile).
template <typename T, int M>
__device__ __forceinline__ void pack_a_tile(uint32_t (&a)[M][4], int j, const float (&c)[4]) {
  set_a_tile(a, j, T::pack(c[0], c[1]), T::pack(c[2], c[3]));
}

// ---- shared memory ----------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l supplies the address of row (l % 8) of matrix (l / 8).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The same, each matrix transposed on the way (for B operands stored k-major).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two 8x8 b16 matrices, transposed on the way; lanes 0-15 supply the addresses (lane l: row l % 8
// of matrix l / 8), the other lanes' addresses are not read.
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

// 16 bytes global -> shared, asynchronously. valid == false writes 16 zero bytes and reads nothing
// (src-size 0), which is how rows past a sequence end become zeros without a branch in the copy.
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

// Brings the 128-byte line holding `p` into this SM's L1 (no register, no wait): for a small
// global read a kernel knows it will make much later, so that the read itself then hits the L1.
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p));
}

// Barrier over `threads` threads (a multiple of 32) with hardware barrier `id` (1..15; 0 is
// __syncthreads): lets a pair of warps exchange values without stopping the whole block. The
// "memory" clobber keeps the compiler from moving shared-memory accesses across it (the values
// exchanged are written before and read after it). bar.arrive counts this warp in and goes on.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// acc + Σ o[e]·d[e] over 8 values, fp32 fused multiply-adds in element order: a lane's share of a
// row of the backward's Delta, which the Delta kernel (portable/attention_backward.cuh) and the VSA
// layer's gate pass (vsa_layer/gate.cu) both sum this way, then over the row's lanes
// (lane_group_sum), so their bits agree.
__device__ __forceinline__ float dot8(const float (&o)[8], const float (&d)[8], float acc = 0.0f) {
#pragma unroll
  for (int e = 0; e < 8; ++e) acc = fmaf(o[e], d[e], acc);
  return acc;
}

// ---- warp reductions --------------------------------------------------------------------------

// Max / sum over the 4 lanes of a quad (the lanes that share an accumulator row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
// Sum over an aligned group of kLanes lanes (a power of two), by the butterfly from the widest
// step down: every lane of the group gets the same bits. mask: the warp's lanes that take part, in
// whole groups.
template <int kLanes>
__device__ __forceinline__ float lane_group_sum(float x, unsigned mask = 0xffffffffu) {
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) x += __shfl_xor_sync(mask, x, off);
  return x;
}
// Max over the 8 lanes with the same t (the lanes that share an accumulator column).
__device__ __forceinline__ float column_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
}
// Max reduce-scatter over the lanes that differ in the lane bits kFirstMask, kFirstMask / 2, ...,
// kFirstMask >> (kSteps - 1): each holds G values (one per group), and after the halving
// exchanges each holds the G >> kSteps groups of its part, a[0 .. G >> kSteps), the reduced
// max over those lanes. With the steps in that order a lane whose bits of the masks, read from the
// first, form the number k keeps groups [k (G >> kSteps), (k + 1) (G >> kSteps)).
// The inner loop runs to the constant G / 2 and tests k < half inside: with the trip count `half`
// (constant only once the outer loop is unrolled) the compiler leaves it rolled, indexes `a` at run
// time and puts it in local memory.
template <int G, int kSteps, int kFirstMask>
__device__ __forceinline__ void halving_max(float (&a)[G]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int half = (G / 2) >> step, mask = kFirstMask >> step;
    const bool upper = (lane & mask) != 0;  // keeps groups [half, 2 half) of its current range
#pragma unroll
    for (int k = 0; k < G / 2; ++k) {
      if (k < half) {
        const float send = upper ? a[k] : a[k + half];
        const float keep = upper ? a[k + half] : a[k];
        a[k] = fmaxf(keep, __shfl_xor_sync(0xffffffffu, send, mask));
      }
    }
  }
}

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

}  // namespace fva::dev
