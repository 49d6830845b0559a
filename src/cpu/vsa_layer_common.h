// Pieces the CPU VSA layer's forward and backward share (SPEC.md section 3b): typed views of the
// reserve's regions, the block-size rule and the block-mean scaling.
#pragma once

#include <cstdint>

#include "core/problems.h"
#include "views.h"
#include "vsa_common.h"
#include "vsa_layer_reserve.h"

namespace fva::cpu::vsa_layer {

constexpr int64_t kBlock = kVsaBlock;

// The reserve's regions (vsa_layer_reserve.h) as views; the record itself is reached through
// `record`.
struct Reserve {
  kern::LayerReserveHeader* record;
  AttnView q_c, k_c, v_c, attn, out_c, out_s;
  I32View q2k_idx, q2k_num;
  F32View lse_s;
};
Reserve reserve_views(const VsaLayerProblem& p, void* reserve);

// Real tokens of block i of either sequence: its size clamped to [0, 64] (the fine branch's rule
// for kv blocks, vsa::kv_tokens, applied to q blocks too).
inline int64_t block_tokens(const I32View& sizes, int64_t i) { return vsa::kv_tokens(sizes, i); }

// What a block mean, and its gradient, is multiplied by: the fp32 reciprocal of the block's size.
// FastVideo divides by the size with the GPU's fast division, which is x times that reciprocal; an
// exact division misses golden layer_nogate_512's k_c where the quotient is a bf16 tie.
inline float inverse_size(int64_t n) { return 1.0f / static_cast<float>(n); }

}  // namespace fva::cpu::vsa_layer
