// The shapes the host code (src/cuda/) and the kernels must agree on, defined once: the block
// shapes and ring depths of the sm_90a kernels (kernels/instantiations.txt instantiates them by these
// names, and the host launches them with these block sizes), and the dynamic shared memory of every
// attention kernel (one formula for the host's launch and the kernel's carving).
#pragma once

#include <stdint.h>

namespace fva::kern {

// Rows of every attention tile: query tiles, key tiles and VSA blocks are 64 tokens.
constexpr int kTileRows = 64;
// Threads of a warpgroup (the unit of wgmma).
constexpr int kWarpgroupThreads = 128;

// The sm_90a QAT forward (sm90/attention_forward.cuh): a producer warpgroup and this many consumer
// warpgroups of 64 query rows each, one block per SM, a ring of this many K/V stages.
constexpr int kSm90ForwardConsumers = 2;
constexpr int kSm90ForwardStages = 4;
constexpr int kSm90ForwardThreads = kWarpgroupThreads * (1 + kSm90ForwardConsumers);
// The compact sm_90a kernels (one warpgroup per block, no producer): the VSA forward runs four
// blocks per SM, the dQ kernel that recomputes S and dP three, dQ from stored dS four.
constexpr int kSm90CompactThreads = kWarpgroupThreads;
constexpr int kSm90VsaForwardBlocksPerSm = 4;
constexpr int kSm90DqBlocksPerSm = 3;
constexpr int kSm90DqFromDsBlocksPerSm = 4;
// The fused backward's conversion of its fp32 dQ accumulator (sm90/dq_accumulator.cuh).
constexpr int kSm90DqConvertBlocksPerSm = 4;
// The sm_90a dK/dV kernel: a producer and one consumer warpgroup of 64 keys, two blocks per SM;
// with dQ fused (QAT, handles that are not deterministic) two consumers of 64 keys, one block per
// SM. Its (Q, dO) ring has this many stages.
constexpr int kSm90DkdvStages = 2;
constexpr int kSm90DkdvConsumers = 1;
constexpr int kSm90DkdvFusedConsumers = 2;
constexpr int kSm90DkdvThreads = kWarpgroupThreads * (1 + kSm90DkdvConsumers);
constexpr int kSm90DkdvFusedThreads = kWarpgroupThreads * (1 + kSm90DkdvFusedConsumers);
constexpr int kSm90DkdvBlocksPerSm = 2;
constexpr int kSm90DkdvFusedBlocksPerSm = 1;
// dQ from stored dS: a ring of this many (K, dS) stages.
constexpr int kSm90DsStages = 2;

// Dynamic shared memory of the attention kernels (one formula for the host and the kernels).
constexpr int forward_smem_bytes(int D) { return 5 * 64 * D * 2 + 2 * 4 * 4; }  // Q, K[2], V[2], slots
constexpr int forward_2warp_smem_bytes(int D) { return 3 * 64 * D * 2 + 2 * 4 * 4; }  // Q, K, V, slots
constexpr int dq_smem_bytes(int D) { return 6 * 64 * D * 2; }                     // Q, dO, K[2], V[2]
// K, V (64 rows), Q[2], dO[2] (32 rows), lse[2][32], Delta[2][32], pair slots [2][4][32].
constexpr int dkdv_smem_bytes(int D) { return 2 * 64 * D * 2 + 4 * 32 * D * 2 + 4 * 32 * 4 + 2 * 4 * 32 * 4; }

// sm_90a forward: query tiles (Q: one 64-row tile per consumer warpgroup), kStages K tiles,
// kStages V tiles each followed by a 64 x 64 region of ones (8 KiB: the 8 columns past V that
// P·V's m64n(D+8) product reads, so that it sums P's rows too), mbarriers (1024 bytes).
constexpr int sm90_forward_smem_bytes(int D, int query_tiles, int stages) {
  return (query_tiles + 2 * stages) * 64 * D * 2 + stages * 64 * 128 + 1024;
}

// The QAT forward's tail split (Sm90ForwardParams): a piece's running state per consumer thread
// (o when P is quantized, o_hp with the rows' sums, the rows' reference maxima), in floats rounded
// up to whole 16-byte vectors; a consumer warpgroup's is 128 times that.
constexpr int sm90_forward_partial_floats(int D, bool quantize_p) {
  return ((quantize_p ? D / 2 : 0) + D / 2 + 4 + 2 + 3) / 4 * 4;
}

// Rows per warp of the Delta pre-pass (portable/attention_backward.cuh, attention_delta): each lane
// reads 8 elements (16 bytes) of o and of dO, so a row of D takes D / 8 lanes; the host launches
// 128-thread blocks of 4 warps.
constexpr int delta_rows_per_warp(int D) { return 32 / (D / 8); }

// sm_90a compact kernels (one warpgroup per block, sm90/compact_tiles.cuh): `tiles` tiles
// and three mbarriers, or (ones_region) `tiles` tiles and an 8 KiB region of ones that holds the
// barriers. The VSA forward: Q, K, V and the ones (P·V's next 64 columns, its rows' sums): 56 KiB
// at D = 128, four blocks in the SM's 228 KiB; the VSA dQ: Q, dO, K, V.
constexpr int sm90_compact_smem_bytes(int D, int tiles, bool ones_region = false) {
  return tiles * 64 * D * 2 + (ones_region ? 64 * 128 : 3 * 8);
}


// sm_90a dK/dV: K and V (per consumer: one, or two with dQ fused), kStages (Q, dO) tile pairs, with
// dQ fused two buffers of a dSᵀ tile per consumer (64 x 64 16-bit) and a 2048-byte tile of ones
// (the B operand of rowsum(dS)); then the stages' lse and Delta, the stages' query-tile records
// (16 bytes each, sm90/attention_dkdv.cuh StagedTile), mbarriers (fused: 4 more).
constexpr int sm90_dkdv_smem_bytes(int D, int stages, bool fuse_dq) {
  return (2 * (fuse_dq ? 2 : 1) + 2 * stages) * 64 * D * 2 +
         (fuse_dq ? 2 * 2 * 64 * 64 * 2 + 2048 : 0) + stages * (2 * 64 * 4 + 16) +
         8 * (1 + 2 * stages + (fuse_dq ? 4 : 0));
}

// The stored dS: one 64 x 64 16-bit tile per (q unit, query tile, key tile or q2k slot), and the dQ
// kernel that reads them: `stages` ring stages of a K tile (64 x D) and a dS tile, then a full
// barrier each.
constexpr int64_t sm90_ds_tile_bytes = 64 * 64 * 2;
constexpr int sm90_dq_from_ds_smem_bytes(int D, int stages) {
  return stages * (64 * D * 2 + static_cast<int>(sm90_ds_tile_bytes)) + 8 * stages;
}

// The fused backward's accumulator rows: every (b, q head)'s query rows, rounded up to 64.
constexpr int64_t sm90_dq_accumulator_rows(int64_t B, int64_t Hq, int64_t Sq) {
  return B * Hq * ((Sq + 63) / 64) * 64;
}
// Its fp32 dQ accumulator and rowsum(dS), in bytes: dq_accum (D floats a row), then ds_rowsum (one).
constexpr int64_t sm90_dq_accumulator_bytes(int64_t B, int64_t Hq, int64_t Sq, int64_t D) {
  return sm90_dq_accumulator_rows(B, Hq, Sq) * (D + 1) * 4;
}

}  // namespace fva::kern
