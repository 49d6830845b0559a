// One online-softmax step (SPEC.md sections 2-3, base 2) on scores held in MMA accumulator
// fragments, shared by the portable forward (mma.sync) and the sm_90a forward (wgmma): both hold a
// warp's 16 query rows with the m16n8 accumulator layout (device_primitives.cuh), so the same code
// turns a sub-tile of scores into the A-operand fragments of P·V:
//     m' = max(m, rowmax(s) * scale_log2);  p = 2^(s * scale_log2 - m');  alpha = 2^(m - m')
//     l  = l * alpha + rowsum(p)           (fp32 p; FastVideo's QAT sums the dtype-rounded p, as
//                                          the sm_90a QAT forward does by wgmma: kSumRows = false)
//     P operands: the dtype-rounded p, and (kQuantizeP) FQ_P(p) with 16-key NVFP4 groups.
// Masking happens before (the schedules say what a masked logit becomes).
#pragma once

#include <math_constants.h>

#include <type_traits>

#include "device_primitives.cuh"
#include "nvfp4_fragments.cuh"

namespace fva::dev {

// Block NVFP4 scales (enc = dec = 1): nothing to compute, and the quantization takes its short form.
struct BlockScalesOnly {
  template <int kNT>
  __device__ __forceinline__ void operator()(const float (&)[kNT][4], SecondLevel (&)[2]) const {}
};
// The same, with each group's scale computed by one lane of the quad and shared (32-key sub-tiles):
// fewer instructions, a few more live registers. The sm_90a forward uses it; the portable forward,
// which holds two m16 tiles per warp and is at its register limit, keeps BlockScalesOnly.
struct BlockScalesQuadShared : BlockScalesOnly {};

// 2^x with the MUFU unit alone. exp2f adds a range fix-up for results below 2^-126 (subnormal p);
// flushing those to 0 moves no output (such p are below bf16's resolution next to the row max's 1).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The maxima of a sub-tile's (masked) scores: mx[r] of rows g and g + 8 (every lane of the quad).
// kGroupMaxFirst (quad-shared block scales of P, 32-key sub-tiles): also the max score of each
// 16-key NVFP4 group, reduced over the quad so that lane t holds group t's (k = 2 kb + r: halving
// exchanges, xor 2 then xor 1), with the rows' maxima following from the groups' (rows r = t & 1,
// two more exchanges). 2^x is monotonic (MUFU.EX2 included: tests/gpu/nvfp4_device_parity checks
// every input), so the group's max p is 2^ of its max score's exponent: its scale can be computed
// before, and beside, the group's exponentials.
template <int kNT, bool kGroupMaxFirst>
__device__ __forceinline__ void score_maxima(const float (&s)[kNT][4], float (&mx)[2],
                                             float& group_max_mine) {
  if constexpr (kGroupMaxFirst) {
    static_assert(kNT == 4, "quad-shared scales: 32-key sub-tiles");
    float group_max[4];
#pragma unroll
    for (int kb = 0; kb < 2; ++kb)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        group_max[2 * kb + r] = fmaxf(fmaxf(s[2 * kb][2 * r], s[2 * kb][2 * r + 1]),
                                      fmaxf(s[2 * kb + 1][2 * r], s[2 * kb + 1][2 * r + 1]));
    halving_max<4, 2, 2>(group_max);  // lane bits 1, 0: t
    const int lane = threadIdx.x & 31;
    const float row_mine = fmaxf(group_max[0], __shfl_xor_sync(0xffffffffu, group_max[0], 2));
    const float row_other = __shfl_xor_sync(0xffffffffu, row_mine, 1);
    mx[0] = (lane & 1) ? row_other : row_mine;
    mx[1] = (lane & 1) ? row_mine : row_other;
    group_max_mine = group_max[0];
  } else {
    mx[0] = mx[1] = -CUDART_INF_F;
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
#pragma unroll
    for (int r = 0; r < 2; ++r) mx[r] = quad_max(mx[r]);
    group_max_mine = -CUDART_INF_F;
  }
}

// The step in two phases, which a kernel may run apart: the exponentials need only s, the operands
// need the operand registers (FlashAttention-3's intra-warpgroup overlap runs the first under the
// previous tile's P·V; measured slower for the QAT forward, docs/perf.md, and not kept).
// online_softmax_step, below, runs them back to back.
//
// Phase 1, softmax_exponentials: s holds kNT n8 tiles of (masked) scores, rows g and g + 8 of the
// warp's m16 tile, and gets p in their place. m: the running max of those two rows (updated);
// alpha: each row's rescale of the output accumulators. kGroupMaxFirst (quad-shared block scales of
// P, 32-key sub-tiles): `mine` gets the scale of the NVFP4 group this lane computes for the quad.
//
// kLazyRescale: m is a row's reference max rather than its running max. It moves (and alpha
// differs from 1) only when the tile's max passes it by more than kLazyRescaleLog2, so p stays
// below 2^kLazyRescaleLog2 and the accumulators are rescaled on few tiles, not on every tile that
// raises some row's max (FlashAttention-4 does the same on Blackwell). o = acc / l and
// lse = m + log2(l) hold for any reference, so only rounding changes: p's relative rounding in
// bf16 and fp32 does not depend on its scale. Not for a quantized P: FQ_P's E4M3 scales are
// defined for p <= 1 relative to the running max (SPEC.md section 2); LazyTileSoftmax, below, keeps
// both maxima for that.
constexpr float kLazyRescaleLog2 = 8.0f;
template <int kNT, bool kGroupMaxFirst, bool kLazyRescale = false>
__device__ __forceinline__ void softmax_exponentials(float (&s)[kNT][4], float (&m)[2],
                                                     float (&alpha)[2], float scale_log2,
                                                     Nvfp4Group& mine) {
  float mx[2];
  float group_max;  // kGroupMaxFirst: the max score of the group this lane scales
  score_maxima<kNT, kGroupMaxFirst>(s, mx, group_max);
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

  // The group this lane scales (kGroupMaxFirst): its max p from its max score.
  if constexpr (kGroupMaxFirst) {
    const int lane = threadIdx.x & 31;
    const float neg_m = (lane & 1) ? -m_use[1] : -m_use[0];  // group t's row is t & 1
    mine = nvfp4_block_group(fast_exp2(fmaf(group_max, scale_log2, neg_m)));
  }

  // p = 2^(s * scale * log2e - m), relative to the running (or reference) max, not rounded yet.
  // The exponent is one FMA (one rounding where the CPU reference rounds the product and then the
  // difference: p moves by an ulp at most).
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = fast_exp2(fmaf(s[j][e], scale_log2, -m_use[e >> 1]));
}

// The quad-shared layout of a 32-key sub-tile's NVFP4 groups (BlockScalesQuadShared): the quad's
// lanes hold the same two rows, and group k = 2 kb + r (16 keys of row r) is scaled by lane k of
// the quad, which every lane fetches its groups from. For each of a lane's four groups:
// fetch(src lane) gets the group's scale data once, and pair(group, x0, x1) quantizes two of its
// values into one packed A-operand register; the four values of group (kb, r) go to a_q[kb][r]
// and a_q[kb][2 + r], as pack_p_operands lays p out.
template <typename Fetch, typename Pair>
__device__ __forceinline__ void quantize_quad_shared_groups(const float (&p)[4][4],
                                                            uint32_t (&a_q)[2][4], Fetch&& fetch,
                                                            Pair&& pair) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kb = 0; kb < 2; ++kb)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const auto grp = fetch((lane & ~3) | (2 * kb + r));
      a_q[kb][r] = pair(grp, p[2 * kb][2 * r], p[2 * kb][2 * r + 1]);
      a_q[kb][2 + r] = pair(grp, p[2 * kb + 1][2 * r], p[2 * kb + 1][2 * r + 1]);
    }
}

// Phase 2: p (phase 1's) as the A operands of the kNT / 2 k16 steps of P·V: a_hp
// the dtype-rounded p (pack_p_operands) and (kQuantizeP) a_q FQ_P(p), 16-key NVFP4 groups
// (quantize_p_operands). second_of(p, second): the second-level NVFP4 factors of the two rows;
// BlockScalesOnly (block scales) selects the short form of the quantization for p >= 0,
// BlockScalesQuadShared the scales phase 1 left in `mine`.
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
                                                    const Nvfp4Group& mine,
                                                    uint32_t (&a_q)[kQuantizeP ? kNT / 2 : 1][4],
                                                    SecondLevelOf&& second_of) {
  constexpr bool kBlock = std::is_base_of_v<BlockScalesOnly, std::decay_t<SecondLevelOf>>;
  constexpr bool kShareScales = std::is_same_v<std::decay_t<SecondLevelOf>, BlockScalesQuadShared>;
  if constexpr (kQuantizeP) {
    SecondLevel second[2];
    second_of(p, second);
    // A group: 16 keys of a row = the 4 values each lane of a quad holds in n8 tiles 2kb, 2kb+1.
    if constexpr (kShareScales) {
      static_assert(kNT == 4, "quad-shared scales: 32-key sub-tiles (4 groups per quad)");
      // Block scales over a 32-key sub-tile: the quad's lanes share 4 groups (k = 2 kb + r), and
      // rather than each lane computing all 4 scales, lane t computed group t's (`mine`, above,
      // from the group's max score) and every lane fetches the 4 it needs. p >= 0, so the max p
      // is the group's amax, bitwise.
      quantize_quad_shared_groups(
          p, a_q, [&](int src) { return nvfp4_block_group_from(mine, src); },
          [](const Nvfp4Group& grp, float x0, float x1) {
            return T::pack(nvfp4_fake_quant_nonneg_block(grp, x0),
                           nvfp4_fake_quant_nonneg_block(grp, x1));
          });
    } else {
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
  constexpr bool kGroupMaxFirst =
      kQuantizeP && std::is_same_v<std::decay_t<SecondLevelOf>, BlockScalesQuadShared>;
  float p[kNT][4];
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) p[j][e] = s[j][e];
  Nvfp4Group mine{};
  static_assert(!(kLazyRescale && kQuantizeP), "FQ_P needs p relative to the running max");
  softmax_exponentials<kNT, kGroupMaxFirst, kLazyRescale>(p, m, alpha, scale_log2, mine);
  pack_p_operands<T, kNT>(p, a_hp);
  // l: the sum of the fp32 p (FastVideo's QAT kernel sums p rounded to the dtype; the two differ
  // by the dtype's rounding errors, unbiased and averaging out, well under 2^-9 of l: unpacking
  // the rounded values again cost two instructions per element).
  if constexpr (kSumRows) {
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) rs[e >> 1] += p[j][e];
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + quad_sum(rs[r]);
  }
  quantize_p_operands<T, kNT, kQuantizeP>(p, mine, a_q, second_of);
}

// The softmax of a whole 64-key tile held as kSubTiles sub-tiles of 32 keys (s: 8 n8 tiles of
// scores, masked), for the sm_90a forward, with the output scale decoupled from the running max:
//   - m_run, the running max, advances per sub-tile as SPEC.md section 2 defines it, and FQ_P's
//     block scales are computed relative to it (each group's amax is 2^(its max score - m_run));
//   - m_ref, the reference the accumulators o, o_hp and l are kept relative to, moves only when the
//     tile's max passes it by more than 2^kLazyRescaleLog2 (alpha: the rows' rescale, exactly 1
//     otherwise), so the caller rescales on few tiles and once per tile, before any P·V of it.
// p is computed relative to m_ref, p_ref = p * 2^(m_run - m_ref) (one FMA and one MUFU per
// element, as before), and the factor is folded into each NVFP4 group's reciprocal and scale
// (a multiplication per group, not per element): FQ_P's E4M3 scales are the running max's, its
// codes those of y = p_ref * r' = p * r (which can differ from the eager form's y in its last bits,
// as the GPU's 2^x already makes it differ from the CPU's), and the operands P·V reads are
// FQ_P(p) * 2^(m_run - m_ref) rounded to the dtype: only rounding differs from scaling o at every
// max change. Without quantization (kQuantizeP false) it is the lazy rescale of
// softmax_exponentials.
// In two parts, so that the caller can rescale between them: LazyTileSoftmax::begin (the maxima,
// the references, alpha, the groups' scales), then operands(sub) per sub-tile: a_hp (the
// dtype-rounded p_ref) and a_q (FQ_P, folded), the A operands of the sub-tile's 2 k16 steps of
// P·V. (The sm_90a forward computes both sub-tiles' operands before any P·V: session 18.)
//
// kFiniteScores: every score is finite (the QAT forward: its Q and K are fake-quantized, so finite,
// and masked keys get a finite logit), so no row's max is -inf after its first tile and the guards
// for rows without a visible key drop out.
template <typename T, int kSubTiles, bool kQuantizeP, bool kFiniteScores>
struct LazyTileSoftmax {
  static constexpr int kNT = 4;  // n8 tiles per 32-key sub-tile
  using Sub = float[kNT][4];
  // bf16 P: FQ_P's rounding and decode in bf16x2 arithmetic (e2m1_round_scale_bf16x2), with the
  // group's scale as a bf16 pair.
  static constexpr bool kPackedDecode = kQuantizeP && std::is_same_v<T, Bf16>;
  float m_use[2];              // the reference each row's p is computed against (finite)
  Nvfp4Group mine[kSubTiles];  // kQuantizeP: the group this lane scales, per sub-tile
  uint32_t scale2[kPackedDecode ? kSubTiles : 1];  // kPackedDecode: mine's scale, twice, in bf16

  __device__ __forceinline__ void begin(const float (&s)[kSubTiles * kNT][4], float (&m_run)[2],
                                        float (&m_ref)[2], float (&alpha)[2], float scale_log2) {
    float mx[kSubTiles][2], group_max[kSubTiles];
#pragma unroll
    for (int sub = 0; sub < kSubTiles; ++sub)
      score_maxima<kNT, kQuantizeP>(reinterpret_cast<const Sub&>(s[sub * kNT]), mx[sub],
                                    group_max[sub]);
    // The running max at each sub-tile (SPEC), then the tile's reference.
    float m_sub[kSubTiles][2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float run = m_run[r];
#pragma unroll
      for (int sub = 0; sub < kSubTiles; ++sub) {
        run = fmaxf(run, __fmul_rn(mx[sub][r], scale_log2));
        m_sub[sub][r] = kFiniteScores || run != -CUDART_INF_F ? run : 0.0f;  // no key yet: p = 0
      }
      m_run[r] = run;
      // -inf <= -inf keeps a row whose keys are all masked so far at -inf; a NaN resets.
      const bool keep = run <= m_ref[r] + kLazyRescaleLog2;
      const float m_new = keep ? m_ref[r] : run;
      m_use[r] = kFiniteScores || m_new != -CUDART_INF_F ? m_new : 0.0f;
      alpha[r] = keep ? 1.0f : fast_exp2(m_ref[r] - m_use[r]);
      m_ref[r] = m_new;
    }
    // The group this lane scales (lane t of the quad: group t, row t & 1), per sub-tile: its E4M3
    // scale s from its max p relative to the running max (amax <= 1: both sub-tiles' scales in one
    // conversion), then moved to the reference: s' = s * 2^(m_run - m_ref), r' = 1 / s' (so
    // y = p_ref * r' = p * r).
    if constexpr (kQuantizeP) {
      static_assert(kSubTiles == 2, "the scales of two sub-tiles per conversion");
      const int row = threadIdx.x & 1;
      const float mu = row ? m_use[1] : m_use[0];
      float ms[2], scale[2];
#pragma unroll
      for (int sub = 0; sub < 2; ++sub) ms[sub] = row ? m_sub[sub][1] : m_sub[sub][0];
      nvfp4_block_scales_unit_pair(fast_exp2(fmaf(group_max[0], scale_log2, -ms[0])),
                                   fast_exp2(fmaf(group_max[1], scale_log2, -ms[1])), scale[0],
                                   scale[1]);
#pragma unroll
      for (int sub = 0; sub < 2; ++sub) {
        mine[sub].e4m3 = scale[sub] * fast_exp2(ms[sub] - mu);
        mine[sub].dec = 1.0f;
        mine[sub].reciprocal = nvfp4_block_reciprocal(mine[sub].e4m3);
        if constexpr (kPackedDecode) scale2[sub] = T::pack(mine[sub].e4m3, mine[sub].e4m3);
      }
    }
  }

  // Sub-tile `sub` of s (scores) -> p_ref in place, and its P·V operands.
  __device__ __forceinline__ void operands(int sub, float (&s)[kSubTiles * kNT][4],
                                           float scale_log2, uint32_t (&a_hp)[kSubTiles * 2][4],
                                           uint32_t (&a_q)[kQuantizeP ? kSubTiles * 2 : 1][4]) {
    Sub& p = reinterpret_cast<Sub&>(s[sub * kNT]);
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) p[j][e] = fast_exp2(fmaf(p[j][e], scale_log2, -m_use[e >> 1]));
    pack_p_operands<T, kNT>(p, reinterpret_cast<uint32_t(&)[kNT / 2][4]>(a_hp[sub * (kNT / 2)]));
    if constexpr (kPackedDecode) {
      // The groups of quantize_p_operands' quad-shared path, each fetched as its reciprocal and
      // its scale as a bf16 pair.
      struct Fetched {
        float rcp;
        uint32_t scale2;
      };
      quantize_quad_shared_groups(
          p, reinterpret_cast<uint32_t(&)[kNT / 2][4]>(a_q[sub * (kNT / 2)]),
          [&](int src) {
            return Fetched{__shfl_sync(0xffffffffu, mine[sub].reciprocal, src),
                           __shfl_sync(0xffffffffu, scale2[sub], src)};
          },
          [](const Fetched& grp, float x0, float x1) {
            return e2m1_round_scale_bf16x2(x0 * grp.rcp, x1 * grp.rcp, grp.scale2);
          });
      return;
    }
    quantize_p_operands<T, kNT, kQuantizeP>(
        p, mine[kQuantizeP ? sub : 0],
        reinterpret_cast<uint32_t(&)[kQuantizeP ? kNT / 2 : 1][4]>(a_q[kQuantizeP ? sub * (kNT / 2) : 0]),
        BlockScalesQuadShared{});
  }
  // Every sub-tile's operands.
  __device__ __forceinline__ void tile_operands(float (&s)[kSubTiles * kNT][4], float scale_log2,
                                                uint32_t (&a_hp)[kSubTiles * 2][4],
                                                uint32_t (&a_q)[kQuantizeP ? kSubTiles * 2 : 1][4]) {
#pragma unroll
    for (int sub = 0; sub < kSubTiles; ++sub) operands(sub, s, scale_log2, a_hp, a_q);
  }
};

// LazyTileSoftmax's quantized form (block scales, finite scores) for a 64-key tile whose keys are
// in the owned-group order (key_order.h): lane t of the quad holds all 16 keys of NVFP4 group t of
// each of its rows (s[j][2r], s[j][2r + 1], j = 0..7), and group t lies in 32-key sub-tile t / 2.
// The arithmetic per element and per group is LazyTileSoftmax's, so the operand values are
// bitwise the same (only their order along the keys differs); but a group's max and scale are the
// lane's own, with no exchange, and the sub-tiles' maxima take two exchanges per row, where the
// natural order took 12 per sub-tile on the softmax's critical path.
template <typename T>
struct OwnedGroupTileSoftmax {
  // bf16 P: FQ_P's rounding and decode in bf16x2 arithmetic, as LazyTileSoftmax's kPackedDecode.
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
    // one conversion), then moved to the reference (LazyTileSoftmax::begin).
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
