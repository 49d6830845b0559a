// The VSA layer's output pass fused into the sm_90a VSA forward's epilogue (SPEC 3b step 5):
// out = dtype(dtype(out_c[block] * gate) + out_s) for the block's 64 rows, out_s being the o the
// epilogue stages for its TMA store (already in the dtype), so the pass over memory that
// vsa_layer/gate.cu makes (reading out_s back from the reserve) is not needed: the layer's forward
// reads the gate and writes out here, beside the fine branch's own store.
// Both ways through shared memory and the TMA, in tiles the mainloop has finished with:
//   - the gate: the block's 64 gate rows into the K tile, loaded by the thread that issues the K
//     loads once the last listed tile's S has read K (issue_layer_gate_load), so that the load
//     runs under that tile's softmax and P·V; its barrier is K's, one phase after the last K;
//   - out: each thread combines every packed o word it stages with the gate word at the same
//     place in the K tile and out_c's word of its columns, stages the result at the same place in
//     the V tile (free once the last P·V has read it), and the TMA stores the V tile beside o's.
// The epilogue then only touches shared memory and issues asynchronous stores: a block's end is
// not held by a round trip to the L2 or the DRAM per row.
#pragma once

#include "primitives/kernel_chain.cuh"
#include "primitives/sm90.cuh"
#include "sm90/compact_tiles.cuh"
#include "vsa_layer/layer_common.cuh"

namespace fva::dev::sm90 {

// Whether the forward computes the layer's output, and whether that has a gate.
__device__ __forceinline__ bool fuses_layer_output(const kern::Sm90FusedLayerGate& G) {
  return G.out.data != nullptr;
}
__device__ __forceinline__ bool fuses_layer_gate_load(const kern::Sm90FusedLayerGate& G) {
  return fuses_layer_output(G) && G.gate.data != nullptr;
}

// The loading thread, once its K tile is free for good: the block's 64 gate rows into it, on K's
// barrier. Where the block sits comes from fresh reads of its index (no register kept across the
// mainloop).
template <typename Tiles>
__device__ __forceinline__ void issue_layer_gate_load(const kern::Sm90FusedLayerGate& G,
                                                      const kern::AttentionParams& p,
                                                      const Tiles& tiles, int k_tile_index) {
  const CompactBlock at(p, opaque(blockIdx.x), opaque(blockIdx.y));
  tiles.load(k_tile_index, &G.gate_map, tiles.bar_k(), at.row0, at.h, at.b);
}

// The epilogue's addition for the layer's call (store_forward_outputs_tma's Extra): made after the
// mainloop by every thread of the block, it waits for out_c's kernel where the forward runs beside
// it, reads the thread's words of out_c (columns 8j + 2t, 8j + 2t + 1 of the block's row), and
// waits for the gate tile (K's barrier at `k_phase`, the phase after the last listed K).
template <typename T, int D, typename Tiles>
struct LayerOutputStage {
  const kern::Sm90FusedLayerGate& G;
  uint32_t gate_tile, out_tile;
  bool gated;
  uint32_t out_c[D / 8];

  __device__ __forceinline__ LayerOutputStage(const kern::Sm90FusedLayerGate& g,
                                              const kern::AttentionParams& p, const Tiles& tiles,
                                              uint32_t gate_tile_, uint32_t out_tile_,
                                              uint32_t k_phase, int t)
      : G(g), gate_tile(gate_tile_), out_tile(out_tile_), gated(g.gate.data != nullptr) {
    const CompactBlock at(p, opaque(blockIdx.x), opaque(blockIdx.y));
    // The forward's last kernel writes the reserve's record (shared/vsa_layer_params.h).
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && G.record != nullptr)
      *G.record = G.record_value;
    // Where the forward runs beside the coarse output (Sm90FusedLayerGate::out_c_beside), out_c is
    // complete only once that kernel is: every block reaches this wait, so the forward completes
    // after it.
    if (G.out_c_beside != 0) wait_for_prior_kernels();
    const int64_t block_row = static_cast<int64_t>(at.bh) * G.nq + at.row0 / 64;  // [B, Hq, nq]
    const uint32_t* row =
        reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(G.out_c) + block_row * D);
#pragma unroll
    for (int j = 0; j < D / 8; ++j) out_c[j] = row[4 * j + t];
    if (gated) mbar_wait</*kSuspend=*/false>(tiles.bar_k(), k_phase);
  }

  __device__ __forceinline__ void stage(uint32_t offset, int j, uint32_t out_s) const {
    const uint32_t gate = gated ? ld_shared_u32(gate_tile + offset) : 0u;
    st_shared_u32(out_tile + offset, layer::gate_combine2<T>(out_c[j], out_s, gate, gated));
  }

  __device__ __forceinline__ void store(int row0, int h, int b) const {
#pragma unroll
    for (int r = 0; r < Tiles::kRegions; ++r)
      tma_store_4d(&G.out_map, out_tile + r * Tiles::kRegionBytes, 64 * r, row0, h, b);
  }
};

}  // namespace fva::dev::sm90
