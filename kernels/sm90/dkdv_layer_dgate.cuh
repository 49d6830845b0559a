// The VSA layer's dgate = dtype(dout * out_c[block]) (SPEC 3b) written by the sm_90a dK/dV kernel
// (kern::Sm90LayerDgate), for the layer's backward. The gate pass (vsa_layer/gate.cu) reads dout
// anyway (for dout_c and the fine backward's Delta), but writing dgate there is a quarter of its
// memory traffic, and that pass lies on the backward's critical path: the coarse backward needs
// its dout_c, and the fine kernels start after the coarse backward. The dK/dV kernel, in contrast,
// is bound by its products, and every q block's 64 dout rows pass through one of its ring stages
// anyway: at the pair of the q block's first list entry (VsaQueryTiles::first_of_q_block), which
// that entry's kv block's dK/dV block alone walks. There, while the pair's dV and dK products run,
// the consumer warpgroup writes the q block's dgate rows from the stage's dO tile, before it
// releases the stage. (Not the producer warpgroup's idle warps: at 24 registers a thread, ptxas
// then spills the producer's loop.)
#pragma once

#include "primitives/block_terms.cuh"
#include "primitives/sm90.cuh"
#include "vsa_layer/layer_common.cuh"

namespace fva::dev::sm90 {

// Every thread of the consumer warpgroup (tid 0-127), at a pair whose StagedTile has writes_dgate:
// the q block of rows [row0, row0 + 64) of q head `head`, its dO tile at do_tile. A thread keeps
// one 16-byte column chunk and every (128 / (D / 8))-th row, a multiple of 8 rows apart, so its
// chunk sits at one position of the 128-byte swizzle in all of them; a warp's stores of one row
// are whole 128-byte lines. check: the layer's record (dgate is the caller's tensor: with the
// reserve of another forward, nothing is written).
template <typename T, int D>
__device__ __forceinline__ void write_layer_dgate_rows(const kern::Sm90BackwardParams& P,
                                                       const RecordCheck& check, int b, int head,
                                                       int row0, uint32_t do_tile, int tid) {
  constexpr int kChunks = D / 8;                // 16-byte chunks per row
  constexpr int kRowStep = 128 / kChunks;       // 8 (D = 128) or 16 (D = 64)
  static_assert(kRowStep % 8 == 0, "a thread's rows share their swizzle position");
  if (!check.passes(P.a)) return;
  const kern::Sm90LayerDgate& G = P.layer_dgate;
  const int chunk = tid % kChunks, first = tid / kChunks;
  const int64_t unit = static_cast<int64_t>(b) * P.a.Hq + head;
  const uint4 oc =
      static_cast<const uint4*>(G.out_c)[(unit * G.nq + (row0 >> 6)) * kChunks + chunk];
  const uint32_t src = swizzled_chunk_128b(do_tile + (chunk / 8) * (64 * 128), first, first & 7,
                                           chunk % 8);
  uint16_t* dst = static_cast<uint16_t*>(G.dgate.data) + b * G.dgate.stride_b +
                  head * G.dgate.stride_h + (row0 + first) * G.dgate.stride_s + 8 * chunk;
  const int rows = min(64, P.a.Sq - row0);
#pragma unroll
  for (int k = 0; k < 64 / kRowStep; ++k) {
    if (first + k * kRowStep < rows)
      *reinterpret_cast<uint4*>(dst + k * kRowStep * G.dgate.stride_s) =
          layer::dgate8<T>(ld_shared_v4(src + k * kRowStep * 128), oc);
  }
}

}  // namespace fva::dev::sm90
