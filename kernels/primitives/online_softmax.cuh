// One online-softmax step (SPEC.md sections 2-3, base 2) on scores held in MMA accumulator
// fragments, shared by the portable forward (mma.sync) and the sm_90a forward (wgmma): both hold a
// warp's 16 query rows with the m16n8 accumulator layout (primitives/sm80.cuh), so the same code
// turns a sub-tile of scores into the A-operand fragments of P·V:
//     m' = max(m, rowmax(s) * scale_log2);  p = 2^(s * scale_log2 - m');  alpha = 2^(m - m')
//     l  = l * alpha + rowsum(p)           (fp32 p; FastVideo's QAT sums the dtype-rounded p, as
//                                          the sm_90a QAT forward does by wgmma: kSumRows = false)
//     P operands: the dtype-rounded p, and (kQuantizeP) FQ_P(p) with 16-key NVFP4 groups.
// Masking happens before (the schedules say what a masked logit becomes).
#pragma once

#include <math_constants.h>

#include <type_traits>

#include "primitives/sm80.cuh"
#include "nvfp4/nvfp4_fragments.cuh"

namespace fva::dev {

// Block NVFP4 scales (enc = dec = 1): nothing to compute, and the quantization takes its short form.
struct BlockScalesOnly {
  template <int kNT>
  __device__ __forceinline__ void operator()(const float (&)[kNT][4], SecondLevel (&)[2]) const {}
};

// 2^x with the MUFU unit alone. exp2f adds a range fix-up for results below 2^-126 (subnormal p);
// flushing those to 0 moves no output (such p are below bf16's resolution next to the row max's 1).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The maxima of a sub-tile's (masked) scores: mx[r] of rows g and g + 8 (every lane of the quad).
template <int kNT>
__device__ __forceinline__ void score_maxima(const float (&s)[kNT][4], float (&mx)[2]) {
  mx[0] = mx[1] = -CUDART_INF_F;
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
#pragma unroll
  for (int r = 0; r < 2; ++r) mx[r] = quad_max(mx[r]);
}

// The step in two phases, which a kernel may run apart: the exponentials need only s, the operands
// need the operand registers (FlashAttention-3's intra-warpgroup overlap runs the first under the
// previous tile's P·V). online_softmax_step, below, runs them back to back.
//
// Phase 1, softmax_exponentials: s holds kNT n8 tiles of (masked) scores, rows g and g + 8 of the
// warp's m16 tile, and gets p in their place. m: the running max of those two rows (updated);
// alpha: each row's rescale of the output accumulators.
//
// kLazyRescale: m is a row's reference max rather than its running max. It moves (and alpha
// differs from 1) only when the tile's max passes it by more than kLazyRescaleLog2, so p stays
// below 2^kLazyRescaleLog2 and the accumulators are rescaled on few tiles, not on every tile that
// raises some row's max (FlashAttention-4 does the same on Blackwell). o = acc / l and
// lse = m + log2(l) hold for any reference, so only rounding changes: p's relative rounding in
// bf16 and fp32 does not depend on its scale. Not for a quantized P: FQ_P's E4M3 scales are
// defined for p <= 1 relative to the running max (SPEC.md section 2); OwnedGroupTileSoftmax, below,
// keeps both maxima for that.
constexpr float kLazyRescaleLog2 = 8.0f;
template <int kNT, bool kLazyRescale = false>
__device__ __forceinline__ void softmax_exponentials(float (&s)[kNT][4], float (&m)[2],
                                                     float (&alpha)[2], float scale_log2) {
  float mx[2];
  score_maxima<kNT>(s, mx);
  float m_use[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float row_max = __fmul_rn(mx[r], scale_log2);
    // Lazy: keep the reference while the row stays within 2^kLazyRescaleLog2 of it (-inf <= -inf
    // keeps a row whose keys are all masked so far at -inf; a NaN takes the exact path).
    const bool keep = kLazyRescale && row_max <= m[r] + kLazyRescaleLog2;
    const float m_new = keep ? m[r] : fmaxf(m[r], row_max);
    // All logits -inf (VSA: every key masked so far): p = 0, not 2^(-inf + inf).
    m_use[r] = m_new == -CUDART_INF_F ? 0.0f : m_new;
    alpha[r] = keep ? 1.0f : fast_exp2(m[r] - m_use[r]);
    m[r] = m_new;
  }

  // p = 2^(s * scale * log2e - m), relative to the running (or reference) max, not rounded yet.
  // The exponent is one FMA (one rounding where the CPU reference rounds the product and then the
  // difference: p moves by an ulp at most).
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = fast_exp2(fmaf(s[j][e], scale_log2, -m_use[e >> 1]));
}

// Phase 2: p (phase 1's) as the A operands of the kNT / 2 k16 steps of P·V: a_hp
// the dtype-rounded p (pack_p_operands) and (kQuantizeP) a_q FQ_P(p), 16-key NVFP4 groups
// (quantize_p_operands). second_of(p, second): the second-level NVFP4 factors of the two rows;
// BlockScalesOnly (block scales) selects the short form of the quantization for p >= 0.
template <typename T, int kNT>
__device__ __forceinline__ void pack_p_operands(const float (&p)[kNT][4],
                                                uint32_t (&a_hp)[kNT / 2][4]) {
#pragma unroll
  for (int kb = 0; kb < kNT / 2; ++kb) {
    a_hp[kb][0] = T::pack(p[2 * kb][0], p[2 * kb][1]);
    a_hp[kb][1] = T::pack(p[2 * kb][2], p[2 * kb][3]);
    a_hp[kb][2] = T::pack(p[2 * kb + 1][0], p[2 * kb + 1][1]);
    a_hp[kb][3] = T::pack(p[2 * kb + 1][2], p[2 * kb + 1][3]);
  }
}
template <typename T, int kNT, bool kQuantizeP, typename SecondLevelOf>
__device__ __forceinline__ void quantize_p_operands(const float (&p)[kNT][4],
                                                    uint32_t (&a_q)[kQuantizeP ? kNT / 2 : 1][4],
                                                    SecondLevelOf&& second_of) {
  constexpr bool kBlock = std::is_base_of_v<BlockScalesOnly, std::decay_t<SecondLevelOf>>;
  if constexpr (kQuantizeP) {
    SecondLevel second[2];
    second_of(p, second);
    // A group: 16 keys of a row = the 4 values each lane of a quad holds in n8 tiles 2kb, 2kb+1.
#pragma unroll
    for (int kb = 0; kb < kNT / 2; ++kb) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float x[4] = {p[2 * kb][2 * r], p[2 * kb][2 * r + 1], p[2 * kb + 1][2 * r],
                      p[2 * kb + 1][2 * r + 1]};
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) amax = nvfp4_amax_step(amax, x[i]);
        if constexpr (kBlock) {
          const Nvfp4Group grp = nvfp4_block_group(quad_max(amax));
#pragma unroll
          for (int i = 0; i < 4; ++i) x[i] = nvfp4_fake_quant_nonneg_block(grp, x[i]);
        } else {
          fake_quantize_values(x, quad_max(amax), second[r]);
        }
        a_q[kb][r] = T::pack(x[0], x[1]);
        a_q[kb][2 + r] = T::pack(x[2], x[3]);
      }
    }
  }
}

// One step: s (scores, masked) -> m, l (updated), alpha, and the P operands, as above.
// kSumRows = false: l is left alone, the caller keeps the rows' sums (the sm_90a QAT forward sums
// a_hp by wgmma against a tile of ones, beside P·V, and rescales them with o).
template <typename T, int kNT, bool kQuantizeP, bool kSumRows = true,
          bool kLazyRescale = false, typename SecondLevelOf>
__device__ __forceinline__ void online_softmax_step(const float (&s)[kNT][4], float (&m)[2],
                                                    float (&l)[2], float (&alpha)[2],
                                                    float scale_log2, uint32_t (&a_hp)[kNT / 2][4],
                                                    uint32_t (&a_q)[kQuantizeP ? kNT / 2 : 1][4],
                                                    SecondLevelOf&& second_of) {
  float p[kNT][4];
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) p[j][e] = s[j][e];
  static_assert(!(kLazyRescale && kQuantizeP), "FQ_P needs p relative to the running max");
  softmax_exponentials<kNT, kLazyRescale>(p, m, alpha, scale_log2);
  pack_p_operands<T, kNT>(p, a_hp);
  // l: the sum of the fp32 p (FastVideo's QAT kernel sums p rounded to the dtype; the two differ
  // by the dtype's rounding errors, unbiased and averaging out, well under 2^-9 of l: unpacking
  // the rounded values again would cost two instructions per element).
  if constexpr (kSumRows) {
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) rs[e >> 1] += p[j][e];
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + quad_sum(rs[r]);
  }
  quantize_p_operands<T, kNT, kQuantizeP>(p, a_q, second_of);
}

// The softmax of a whole 64-key tile held as kSubTiles sub-tiles of 32 keys (s: 8 n8 tiles of
// scores, masked), for the sm_90a forward of plain attention (unquantized P), with the output
// scale decoupled from the running max:
//   - m_run, the running max, advances per sub-tile as SPEC.md section 2 defines it;
//   - m_ref, the reference the accumulators o, o_hp and l are kept relative to, moves only when the
//     tile's max passes it by more than 2^kLazyRescaleLog2 (alpha: the rows' rescale, exactly 1
//     otherwise), so the caller rescales on few tiles and once per tile, before any P·V of it.
// p is computed relative to m_ref: the lazy rescale of softmax_exponentials over a whole tile. In
// two parts, so that the caller can rescale between them: begin (the maxima, the references,
// alpha), then tile_operands: a_hp (the dtype-rounded p), the A operands of the tile's 4 k16
// steps of P·V. Quantized P: OwnedGroupTileSoftmax, below.
template <typename T, int kSubTiles>
struct LazyTileSoftmax {
  static constexpr int kNT = 4;  // n8 tiles per 32-key sub-tile
  using Sub = float[kNT][4];
  float m_use[2];  // the reference each row's p is computed against (finite)

  __device__ __forceinline__ void begin(const float (&s)[kSubTiles * kNT][4], float (&m_run)[2],
                                        float (&m_ref)[2], float (&alpha)[2], float scale_log2) {
    float mx[kSubTiles][2];
#pragma unroll
    for (int sub = 0; sub < kSubTiles; ++sub)
      score_maxima<kNT>(reinterpret_cast<const Sub&>(s[sub * kNT]), mx[sub]);
    // The running max at each sub-tile (SPEC), then the tile's reference.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float run = m_run[r];
#pragma unroll
      for (int sub = 0; sub < kSubTiles; ++sub) run = fmaxf(run, __fmul_rn(mx[sub][r], scale_log2));
      m_run[r] = run;
      // -inf <= -inf keeps a row whose keys are all masked so far at -inf; a NaN resets.
      const bool keep = run <= m_ref[r] + kLazyRescaleLog2;
      const float m_new = keep ? m_ref[r] : run;
      m_use[r] = m_new != -CUDART_INF_F ? m_new : 0.0f;  // no key yet: p = 0
      alpha[r] = keep ? 1.0f : fast_exp2(m_ref[r] - m_use[r]);
      m_ref[r] = m_new;
    }
  }

  // s (scores) -> p_ref in place, and the tile's P·V operands (a_q: unused).
  __device__ __forceinline__ void tile_operands(float (&s)[kSubTiles * kNT][4], float scale_log2,
                                                uint32_t (&a_hp)[kSubTiles * 2][4],
                                                uint32_t (&)[1][4]) {
#pragma unroll
    for (int j = 0; j < kSubTiles * kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = fast_exp2(fmaf(s[j][e], scale_log2, -m_use[e >> 1]));
    pack_p_operands<T, kSubTiles * kNT>(s, a_hp);
  }
};

// The sm_90a forward's softmax of a 64-key tile with quantized P (block scales; every score
// finite: Q and K are fake-quantized, and masked keys get a finite logit, so no row's max is -inf
// after its first tile), as LazyTileSoftmax above but with FQ_P's scales kept relative to the
// running max, as SPEC.md section 2 defines them (each group's amax is 2^(its max score - the
// running max at its sub-tile); 2^x is monotonic, MUFU.EX2 included, tests/gpu/nvfp4_device_parity,
// so a group's max p follows from its max score). p is computed relative to m_ref, p_ref =
// p * 2^(m_run - m_ref) (one FMA and one MUFU per element), and the factor is folded into each
// group's reciprocal and scale (a multiplication per group, not per element): FQ_P's E4M3
// scales are the running max's, its codes those of y = p_ref * r' = p * r (which can differ from
// the eager form's y in its last bits, as the GPU's 2^x already makes it differ from the CPU's),
// and the operands P·V reads are FQ_P(p) * 2^(m_run - m_ref) rounded to the dtype: only
// rounding differs from scaling o at every max change.
//
// The tile's keys are in the owned-group order (shared/key_order.h): lane t of the quad holds all 16
// keys of NVFP4 group t of each of its rows (s[j][2r], s[j][2r + 1], j = 0..7), and group t lies
// in 32-key sub-tile t / 2, so a group's max and scale are the lane's own, with no exchange, and
// the sub-tiles' maxima take two exchanges per row. (In the natural order a group would be spread
// over the quad: 12 exchanges per sub-tile on the softmax's critical path.)
template <typename T>
struct OwnedGroupTileSoftmax {
  // bf16 P: FQ_P's rounding and decode in bf16x2 arithmetic (e2m1_round_scale_bf16x2), with the
  // group's scale as a bf16 pair.
  static constexpr bool kPackedDecode = std::is_same_v<T, Bf16>;
  float m_use[2];           // the reference each row's p is computed against (finite)
  Nvfp4Group group[2];      // this lane's group, per row (scale relative to the reference)
  uint32_t scale2[kPackedDecode ? 2 : 1];  // kPackedDecode: group[r]'s scale, twice, in bf16

  __device__ __forceinline__ void begin(const float (&s)[8][4], float (&m_run)[2],
                                        float (&m_ref)[2], float (&alpha)[2], float scale_log2) {
    const bool second = (threadIdx.x & 2) != 0;  // this lane's groups lie in sub-tile 1
    float group_max[2], m_group[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float x[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = fmaxf(s[j][2 * r], s[j][2 * r + 1]);
#pragma unroll
      for (int w = 4; w >= 1; w /= 2)
#pragma unroll
        for (int j = 0; j < w; ++j) x[j] = fmaxf(x[j], x[j + w]);
      group_max[r] = x[0];
      // The sub-tiles' maxima: this lane's pair of groups, then the other pair's.
      const float mine = fmaxf(x[0], __shfl_xor_sync(0xffffffffu, x[0], 1));
      const float other = __shfl_xor_sync(0xffffffffu, mine, 2);
      // The running max at each sub-tile (SPEC), then the tile's reference.
      float run = fmaxf(m_run[r], __fmul_rn(second ? other : mine, scale_log2));
      const float run0 = run;
      run = fmaxf(run, __fmul_rn(second ? mine : other, scale_log2));
      m_group[r] = second ? run : run0;
      m_run[r] = run;
      const bool keep = run <= m_ref[r] + kLazyRescaleLog2;
      const float m_new = keep ? m_ref[r] : run;
      m_use[r] = m_new;  // finite scores (QAT): no row is without a key
      alpha[r] = keep ? 1.0f : fast_exp2(m_ref[r] - m_use[r]);
      m_ref[r] = m_new;
    }
    // Each row's group: its E4M3 scale from its max p relative to the running max (both rows in
    // one conversion), then moved to the reference (s' = s * 2^(m_run - m_ref), r' = 1 / s').
    float scale[2];
    nvfp4_block_scales_unit_pair(fast_exp2(fmaf(group_max[0], scale_log2, -m_group[0])),
                                 fast_exp2(fmaf(group_max[1], scale_log2, -m_group[1])), scale[0],
                                 scale[1]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      group[r].e4m3 = scale[r] * fast_exp2(m_group[r] - m_use[r]);
      group[r].dec = 1.0f;
      group[r].reciprocal = nvfp4_block_reciprocal(group[r].e4m3);
      if constexpr (kPackedDecode) scale2[r] = T::pack(group[r].e4m3, group[r].e4m3);
    }
  }

  // s (scores) -> p_ref in place, and the A operands of the tile's 4 k16 steps of P·V.
  __device__ __forceinline__ void tile_operands(float (&s)[8][4], float scale_log2,
                                                uint32_t (&a_hp)[4][4], uint32_t (&a_q)[4][4]) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = fast_exp2(fmaf(s[j][e], scale_log2, -m_use[e >> 1]));
    pack_p_operands<T, 8>(s, a_hp);
    // a_q[kb][i] as pack_p_operands lays out a_hp: n8 tile 2 kb + i / 2, row i % 2.
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int j = 2 * kb + i / 2, r = i % 2;
        const float x0 = s[j][2 * r], x1 = s[j][2 * r + 1];
        if constexpr (kPackedDecode) {
          a_q[kb][i] = e2m1_round_scale_bf16x2(x0 * group[r].reciprocal, x1 * group[r].reciprocal,
                                               scale2[r]);
        } else {
          a_q[kb][i] = T::pack(nvfp4_fake_quant_nonneg_block(group[r], x0),
                               nvfp4_fake_quant_nonneg_block(group[r], x1));
        }
      }
  }
};

}  // namespace fva::dev
