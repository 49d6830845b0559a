// The VSA layer's output pass fused into the sm_90a VSA forward's epilogue (SPEC 3b step 5):
// out = dtype(dtype(out_c[block] * gate) + out_s) for the block's 64 rows, out_s read back from the
// tile the epilogue staged for its TMA store (the o it stores, already in the dtype), so the pass
// over memory that vsa_layer/gate.cu makes (reading out_s back from the reserve) is not needed:
// the layer's forward reads the gate and writes out here, beside the fine branch's own store.
// The staged tile is laid out as the TMA's 128-byte swizzle (regions of 64 columns): each thread
// moves 16-byte chunks, a row's chunks over consecutive threads, so the gate's loads and out's
// stores are whole 16-byte vectors of consecutive addresses.
#pragma once

#include "primitives/kernel_chain.cuh"
#include "primitives/sm90.cuh"
#include "sm90/compact_tiles.cuh"
#include "vsa_layer/layer_common.cuh"

namespace fva::dev::sm90 {

// The block's row of out_c ([B, Hq, nq, D], contiguous): its q block's coarse output.
template <int D>
__device__ __forceinline__ const uint16_t* layer_out_c_row(const kern::Sm90FusedLayerGate& G,
                                                           const CompactBlock& at) {
  const int64_t row = static_cast<int64_t>(at.bh) * G.nq + at.row0 / 64;
  return static_cast<const uint16_t*>(G.out_c) + row * D;
}

// Before the epilogue stages o: asks the L2 for the block's out_c row and 64 gate rows, so that
// their DRAM latency passes while the epilogue normalizes and stages o, and fused_layer_gate's
// loads find them in the L2 (prefetches: no register, no wait). Where the forward runs beside the
// coarse output (Sm90FusedLayerGate::out_c_beside), it first waits for that kernel, which writes
// out_c: every block reaches this point, so the forward completes after it.
template <int D>
__device__ __forceinline__ void prefetch_layer_gate(const kern::Sm90FusedLayerGate& G,
                                                    const kern::AttentionParams& p, int tid) {
  constexpr int kLinesPerRow = D * 2 / 128;  // 128-byte lines of a row: 2 (D = 128), 1 (D = 64)
  const CompactBlock at(p, opaque(blockIdx.x), opaque(blockIdx.y));
  if (G.gate.data != nullptr) {
    for (int l = tid; l < 64 * kLinesPerRow; l += kern::kWarpgroupThreads) {
      const int r = l / kLinesPerRow, part = l % kLinesPerRow;
      prefetch_l2(layer::row_of(G.gate, at.b, at.h, at.row0 + r) + part * 64);
    }
  }
  if (G.out_c_beside != 0) wait_for_prior_kernels();
  if (tid < kLinesPerRow) prefetch_l2(layer_out_c_row<D>(G, at) + tid * 64);
}

// After store_forward_outputs_tma (its barrier has made the staged tile visible to every thread;
// the TMA store only reads the tile, as this pass does).
template <typename T, int D, typename Tiles>
__device__ __forceinline__ void fused_layer_gate(const kern::Sm90FusedLayerGate& G,
                                                 const kern::AttentionParams& p, uint32_t staging,
                                                 int tid) {
  using namespace fva::dev::layer;
  constexpr int kVecPerRow = D / 8;                          // 16-byte chunks per row
  constexpr int kRowsPerPass = kern::kWarpgroupThreads / kVecPerRow;  // 8 (D = 128) or 16 (D = 64)
  const CompactBlock at(p, opaque(blockIdx.x), opaque(blockIdx.y));
  // The forward's last kernel writes the reserve's record (shared/vsa_layer_params.h).
  if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 0 && G.record != nullptr)
    *G.record = G.record_value;
  const int c = tid % kVecPerRow, r0 = tid / kVecPerRow;
  float oc[8];
  unpack8<T>(reinterpret_cast<const uint4*>(layer_out_c_row<D>(G, at))[c], oc);
  const uint32_t region = staging + (c / 8) * Tiles::kRegionBytes;
  const bool gated = G.gate.data != nullptr;
#pragma unroll 4
  for (int r = r0; r < 64; r += kRowsPerPass) {
    const int64_t s = at.row0 + r;
    const uint4 os = ld_shared_u128(swizzled_chunk_128b(region, r, r % 8, c % 8));
    const uint4* gate =
        gated ? reinterpret_cast<const uint4*>(row_of(G.gate, at.b, at.h, s) + 8 * c) : nullptr;
    *reinterpret_cast<uint4*>(mutable_row_of(G.out, at.b, at.h, s) + 8 * c) =
        gate_combine8<T>(oc, os, gate);
  }
}

}  // namespace fva::dev::sm90
