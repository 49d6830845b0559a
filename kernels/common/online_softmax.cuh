// One online-softmax step (SPEC.md sections 2-3, base 2) on scores held in MMA accumulator
// fragments, shared by the portable forward (mma.sync) and the sm_90a forward (wgmma): both hold a
// warp's 16 query rows with the m16n8 accumulator layout (device_primitives.cuh), so the same code
// turns a sub-tile of scores into the A-operand fragments of P·V:
//     m' = max(m, rowmax(s) * scale_log2);  p = 2^(s * scale_log2 - m');  alpha = 2^(m - m')
//     l  = l * alpha + rowsum(p)           (QAT: the p rounded to the dtype, FastVideo's sum)
//     P operands: the dtype-rounded p, and (kQuantizeP) FQ_P(p) with 16-key NVFP4 groups.
// Masking happens before (the schedules say what a masked logit becomes).
#pragma once

#include <math_constants.h>

#include "device_primitives.cuh"
#include "nvfp4_fragments.cuh"

namespace fva::dev {

// s: kNT n8 tiles of scores (masked), rows g and g + 8 of the warp's m16 tile. m, l: the running
// max and sum of those two rows (updated). alpha: each row's rescale of the output accumulators.
// a_hp / a_q: P (and FQ_P(P)) as the A operands of the kNT / 2 k16 steps of P·V.
// second_of(pr, second): the second-level NVFP4 factors of the two rows (block scales: leave them).
template <typename T, int kNT, bool kQuantizeP, typename SecondLevelOf>
__device__ __forceinline__ void online_softmax_step(const float (&s)[kNT][4], float (&m)[2],
                                                    float (&l)[2], float (&alpha)[2],
                                                    float scale_log2, uint32_t (&a_hp)[kNT / 2][4],
                                                    uint32_t (&a_q)[kQuantizeP ? kNT / 2 : 1][4],
                                                    SecondLevelOf&& second_of) {
  float mx[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
  float m_use[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = fmaxf(m[r], __fmul_rn(quad_max(mx[r]), scale_log2));
    // All logits -inf (VSA: every key masked so far): p = 0, not 2^(-inf + inf).
    m_use[r] = m_new == -CUDART_INF_F ? 0.0f : m_new;
    alpha[r] = exp2f(m[r] - m_use[r]);
    m[r] = m_new;
  }

  // p = 2^(s * scale * log2e - m), relative to the running max (not rounded yet).
  float pr[kNT][4];
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) pr[j][e] = exp2f(__fmul_rn(s[j][e], scale_log2) - m_use[e >> 1]);

  // l: the quantized path sums p rounded to the dtype (FastVideo's QAT kernel), the plain path and
  // VSA the fp32 p.
  float rs[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) rs[e >> 1] += kQuantizeP ? T::round(pr[j][e]) : pr[j][e];
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + quad_sum(rs[r]);

#pragma unroll
  for (int kb = 0; kb < kNT / 2; ++kb) {
    a_hp[kb][0] = T::pack(pr[2 * kb][0], pr[2 * kb][1]);
    a_hp[kb][1] = T::pack(pr[2 * kb][2], pr[2 * kb][3]);
    a_hp[kb][2] = T::pack(pr[2 * kb + 1][0], pr[2 * kb + 1][1]);
    a_hp[kb][3] = T::pack(pr[2 * kb + 1][2], pr[2 * kb + 1][3]);
  }
  if constexpr (kQuantizeP) {
    SecondLevel second[2];
    second_of(pr, second);
    // A group: 16 keys of a row = the 4 values each lane of a quad holds in n8 tiles 2kb, 2kb+1.
#pragma unroll
    for (int kb = 0; kb < kNT / 2; ++kb) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float x[4] = {pr[2 * kb][2 * r], pr[2 * kb][2 * r + 1], pr[2 * kb + 1][2 * r],
                      pr[2 * kb + 1][2 * r + 1]};
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) amax = nvfp4_amax_step(amax, x[i]);
        fake_quantize_values(x, quad_max(amax), second[r]);
        a_q[kb][r] = T::pack(x[0], x[1]);
        a_q[kb][2 + r] = T::pack(x[2], x[3]);
      }
    }
  }
}

// Block NVFP4 scales (enc = dec = 1): nothing to compute.
struct BlockScalesOnly {
  template <int kNT>
  __device__ __forceinline__ void operator()(const float (&)[kNT][4], SecondLevel (&)[2]) const {}
};

}  // namespace fva::dev
