// The CPU backend's reserve for the whole VSA layer (fva_vsa_layer_forward writes it, the backward
// reads it): a record of what the forward computed, so that the backward can refuse a reserve of
// other shapes or another config, then the forward's intermediates. Every region starts at a
// multiple of 64 bytes from the reserve's own start (not from an aligned base), so a reserve copied
// to another 16-byte aligned address keeps its meaning.
//
// Regions, each contiguous and row-major ("dtype": the attention tensors' bf16 or f16 bits):
//   record                                   kern::LayerReserveHeader (core/vsa_layer_record.h)
//   q_c     [B, Hq, nq, D]        dtype      block means of q
//   k_c     [B, Hkv, nkv, D]      dtype      block means of k
//   v_c     [B, Hkv, nkv, D]      dtype      block means of v
//   attn    [B, Hq, nq, nkv]      dtype      coarse attention weights (0 for kv blocks of size 0)
//   out_c   [B, Hq, nq, D]        dtype      coarse output
//   q2k_idx [B, Hq, nq, topk]     int32      selected kv blocks, ascending, -1 past q2k_num
//   q2k_num [B, Hq, nq]           int32
//   out_s   [B, Hq, 64 nq, D]     dtype      fine branch output
//   lse_s   [B, Hq, 64 nq]        fp32       fine branch lse (base 2)
// with topk the effective count (VsaLayerProblem::topk, at most nkv). Header-only so that the tests
// can read the block means the forward left here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/problems.h"
#include "core/vsa_layer_record.h"

namespace fva::cpu {

// Byte offsets of the regions from the reserve's start, and the reserve's size.
struct VsaLayerReserveLayout {
  size_t record = 0, q_c = 0, k_c = 0, v_c = 0, attn = 0, out_c = 0, q2k_idx = 0, q2k_num = 0,
         out_s = 0, lse_s = 0;
  size_t bytes = 0;
};

inline VsaLayerReserveLayout vsa_layer_reserve_layout(const VsaLayerProblem& p) {
  const VsaProblem& f = p.fine;
  const size_t half = 2, nq = static_cast<size_t>(f.num_q_blocks),
               nkv = static_cast<size_t>(f.num_kv_blocks), D = static_cast<size_t>(f.D);
  const size_t bhq = static_cast<size_t>(f.B * f.Hq), bhkv = static_cast<size_t>(f.B * f.Hkv);
  const size_t rows = bhq * nq * static_cast<size_t>(kVsaBlock);
  VsaLayerReserveLayout l;
  size_t used = 0;
  auto add = [&used](size_t bytes) {
    const size_t at = used;
    used += (bytes + 63) / 64 * 64;
    return at;
  };
  l.record = add(sizeof(kern::LayerReserveHeader));
  l.q_c = add(half * bhq * nq * D);
  l.k_c = add(half * bhkv * nkv * D);
  l.v_c = add(half * bhkv * nkv * D);
  l.attn = add(half * bhq * nq * nkv);
  l.out_c = add(half * bhq * nq * D);
  l.q2k_idx = add(sizeof(int32_t) * bhq * nq * static_cast<size_t>(p.topk));
  l.q2k_num = add(sizeof(int32_t) * bhq * nq);
  l.out_s = add(half * rows * D);
  l.lse_s = add(sizeof(float) * rows);
  l.bytes = used;
  return l;
}

}  // namespace fva::cpu
