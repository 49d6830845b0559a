// The sm_90a QAT forward's tail split: which query tile and which share of its key tiles a block
// runs, and how the pieces of a split tile meet.
//
// Why: the forward runs one block per SM, one 128-row query tile per block, all tiles equally
// long (non-causal). B = 1, H = 8 at S = 16384 is 1024 tiles on 132 SMs, 7.76 waves: the eighth
// wave keeps 100 SMs busy and 32 idle for a whole tile's time, 3% of the kernel (32768: 15.5
// waves, the same 3%). Splitting the tail's tiles over their key tiles lets every SM take a piece
// of the last wave; the host (src/cuda/sm90_kernels.cpp) picks how many pieces.
//
// A piece is the usual mainloop over a contiguous range of key tiles. Each consumer thread then
// holds its rows' running state relative to its own reference maxima: the accumulators o (FQ_P(P)
// V, quantized P) and o_hp (P V, with the rows' sums l in its last four registers) and m. A piece
// but the tile's last stores that state (fp32, as it is) and raises a flag; the last piece waits
// for the flags in piece order and merges each state into its own,
//     m' = max(m, m_j),  acc' = acc 2^(m - m') + acc_j 2^(m_j - m')  (o, o_hp and l alike),
// the online softmax's own step, then writes the outputs. The merge order is fixed, so the result
// is the same on every run; it differs from the unsplit kernel's by rounding (fp32, and P's
// operands, which are relative to another reference).
//
// Quantized P needs more: SPEC.md quantizes p = exp2(s - m') against the running max m' over every
// key before it, and a piece that started its running max from its own keys would compute another
// FQ_P (and an o visibly off the reference). So with quantized P every piece but the last first
// runs its key tiles through S alone (K only: the producer completes the stage's V barrier without
// a load; sm90/forward_producer.cuh, sm90/forward_mainloop.cuh), publishes its rows' maxima, and
// only then runs its mainloop; a piece after the first starts its running max from the maxima of
// the pieces before it (their keys are exactly the ones before its own). FQ_P's scales and codes
// are then SPEC's.
//
// The waits need the earlier pieces to make progress: they are lower block indices, which the
// hardware dispatches first (the same assumption as CUTLASS's stream-K fix-up and FlashAttention
// 3's deterministic backward), and no piece waits for a later one.
#pragma once

#include <math_constants.h>

#include "shared/forward_split_plan.h"
#include "shared/kernel_params.h"
#include "primitives/sm90.cuh"

namespace fva::dev::sm90 {

// Block `block` of the QAT forward's one-dimensional grid (shared/forward_split_plan.h's mapping).
struct ForwardTile : kern::ForwardBlockWork {
  __device__ __forceinline__ ForwardTile(const kern::Sm90ForwardParams& P, int block)
      : kern::ForwardBlockWork(
            kern::forward_block_work(block, P.split_first, P.split_pieces, P.cluster)) {}
  __device__ __forceinline__ bool writes_partial() const { return piece + 1 < pieces; }
};

// The pieces' states of one split tile and consumer warpgroup: piece j's vectors at
// partials + ((split (pieces - 1) + j) kConsumers + consumer) kVectors 128 float4s, laid out
// [vector][thread] (a warp's store or load is 512 contiguous bytes), and its flag likewise.
template <int D, bool kQuantizeP, int kConsumers>
struct ForwardPartials {
  static constexpr int kO = kQuantizeP ? D / 2 : 0;  // o's registers (quantized P only)
  static constexpr int kHp = D / 2 + 4;              // o_hp's, the sums included
  static constexpr int kVectors = kern::sm90_forward_partial_floats(D, kQuantizeP) / 4;
  static constexpr int kMVector = (kO + kHp) / 4;  // m's two values open this vector
  static_assert((kO + kHp) % 4 == 0 && kMVector < kVectors, "m starts a vector of its own");

  float4* states;  // piece 0's, this consumer's
  uint32_t* flags;
  size_t slot0;  // piece 0's slot, this consumer's: (split (pieces - 1)) kConsumers + consumer

  __device__ __forceinline__ ForwardPartials(const kern::Sm90ForwardParams& P, int split,
                                             int consumer) {
    slot0 = static_cast<size_t>(split) * (P.split_pieces - 1) * kConsumers + consumer;
    states = reinterpret_cast<float4*>(P.split_partials) + slot0 * kVectors * 128;
    flags = P.split_flags + slot0;
  }
  __device__ __forceinline__ size_t max_slot(int piece) const {
    return slot0 + static_cast<size_t>(piece) * kConsumers;
  }
  // One thread: until another block has raised *flag (acquire: its stores before are visible).
  __device__ __forceinline__ static void wait_flag(const uint32_t* flag) {
    for (;;) {
      uint32_t raised;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(raised) : "l"(flag) : "memory");
      if (raised != 0u) return;
      __nanosleep(200);
    }
  }
  // The consumer warpgroup, after its threads' stores of what `flag` announces: raises it (release,
  // at the GPU's scope, once every thread's stores are fenced).
  __device__ __forceinline__ static void raise_flag(uint32_t* flag, int tid, int barrier) {
    __threadfence();  // each thread's stores before the flag, at the GPU's scope
    named_barrier_sync(barrier, 128);
    if (tid == 0)
      asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(flag), "r"(1u) : "memory");
  }
  // The consumer warpgroup: waits until `count` flags, `stride` words apart from `first`, are
  // raised; then every thread may read what they announce.
  __device__ __forceinline__ static void await_flags(const uint32_t* first, int count, int stride,
                                                     int tid, int barrier) {
    if (tid == 0)
      for (int j = 0; j < count; ++j) wait_flag(first + j * stride);
    named_barrier_sync(barrier, 128);
    __threadfence();
  }
  __device__ __forceinline__ float4* state(int piece) const {
    return states + static_cast<size_t>(piece) * kConsumers * kVectors * 128;
  }
  __device__ __forceinline__ uint32_t* flag(int piece) const { return flags + piece * kConsumers; }

  // Element f of a thread's state: o, then o_hp, then m (f is a constant once unrolled).
  __device__ __forceinline__ static float& at(int f, float (&o)[kQuantizeP ? D / 2 : 1],
                                              float (&o_hp)[kHp], float (&m)[2], float& pad) {
    if (f < kO) return o[f];
    if (f < kO + kHp) return o_hp[f - kO];
    if (f < kO + kHp + 2) return m[f - kO - kHp];
    return pad;
  }

  // The consumer warpgroup (tid = its thread, barrier = a named barrier of its 128 threads alone)
  // stores its state as `piece`'s and raises the piece's flag.
  __device__ __forceinline__ void publish(int piece, int tid, int barrier,
                                          float (&o)[kQuantizeP ? D / 2 : 1], float (&o_hp)[kHp],
                                          float (&m)[2]) const {
    float pad = 0.0f;
    float4* dst = state(piece) + tid;
#pragma unroll
    for (int v = 0; v < kVectors; ++v)
      __stcg(dst + v * 128, make_float4(at(4 * v, o, o_hp, m, pad), at(4 * v + 1, o, o_hp, m, pad),
                                        at(4 * v + 2, o, o_hp, m, pad),
                                        at(4 * v + 3, o, o_hp, m, pad)));
    raise_flag(flag(piece), tid, barrier);
  }

  // Quantized P: this consumer's rows' maxima over `piece`'s keys (m: rows g and g + 8, the
  // scaled scores, as the softmax's running max takes them), published for the later pieces.
  __device__ __forceinline__ void publish_max(const kern::Sm90ForwardParams& P, int piece, int tid,
                                              int barrier, const float (&m)[2]) const {
    __stcg(reinterpret_cast<float2*>(P.split_maxima) + max_slot(piece) * 128 + tid,
           make_float2(m[0], m[1]));
    raise_flag(P.split_max_flags + max_slot(piece), tid, barrier);
  }
  // The running max before `piece`'s keys: the maxima of pieces 0 .. piece - 1, waited for.
  __device__ __forceinline__ void earlier_max(const kern::Sm90ForwardParams& P, int piece, int tid,
                                              int barrier, float (&m)[2]) const {
    await_flags(P.split_max_flags + max_slot(0), piece, kConsumers, tid, barrier);
    for (int j = 0; j < piece; ++j) {
      const float2 x =
          __ldcg(reinterpret_cast<const float2*>(P.split_maxima) + max_slot(j) * 128 + tid);
      m[0] = fmaxf(m[0], x.x);
      m[1] = fmaxf(m[1], x.y);
    }
  }

  // Waits for `piece`'s flag and merges its state into this thread's.
  __device__ __forceinline__ void merge(int piece, int tid, int barrier,
                                        float (&o)[kQuantizeP ? D / 2 : 1], float (&o_hp)[kHp],
                                        float (&m)[2]) const {
    await_flags(flag(piece), 1, 0, tid, barrier);
    const float4* src = state(piece) + tid;
    const float4 mv = __ldcg(src + kMVector * 128);
    const float m_in[2] = {mv.x, mv.y};
    float own[2], in[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float mm = fmaxf(m[r], m_in[r]);
      own[r] = m[r] == -CUDART_INF_F ? 0.0f : exp2f(m[r] - mm);
      in[r] = m_in[r] == -CUDART_INF_F ? 0.0f : exp2f(m_in[r] - mm);
      m[r] = mm;
    }
    float pad = 0.0f;
#pragma unroll
    for (int v = 0; v < kMVector; ++v) {
      const float4 x = __ldcg(src + v * 128);
      const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int f = 4 * v + e, r = (f >> 1) & 1;  // the rescale's row rule (kO % 4 == 0)
        float& acc = at(f, o, o_hp, m, pad);
        acc = acc * own[r] + xs[e] * in[r];
      }
    }
  }
};

}  // namespace fva::dev::sm90
