// The parameter blocks the host passes to the portable attention kernels, by value. Plain structs of
// pointers, element strides and flags, shared by the CUDA backend (src/cuda/, plain C++) and the
// kernels (nvcc), so both sides always agree on the layout.
#pragma once

#include <stdint.h>

#include "shared/host_device.h"
#include "shared/kernel_traits.h"
#include "shared/layer_reserve_record.h"

namespace fva::kern {

// A [B, H, S, D] tensor (16-bit elements) with element strides; the last dimension is contiguous.
struct Tensor4 {
  void* data;
  int64_t stride_b, stride_h, stride_s;
};

// A [B, H, S] fp32 tensor (lse, Delta).
struct Tensor3 {
  float* data;
  int64_t stride_b, stride_h, stride_s;
};

// VSA block metadata as the caller passed it (int32, element strides; last dimension contiguous).
struct VsaLists {
  const int32_t* q2k_idx;  // [B, Hq, num_q_blocks, max_k]
  int64_t idx_stride_b, idx_stride_h, idx_stride_qb;
  const int32_t* q2k_num;  // [B, Hq, num_q_blocks]
  int64_t num_stride_b, num_stride_h, num_stride_qb;
  const int32_t* block_sizes;  // [num_kv_blocks]
  int64_t block_sizes_stride;
  int32_t num_q_blocks, num_kv_blocks, max_k;
  // The backward's inverse (built in the workspace by vsa_build_inverse): for unit (b, hq), kv block
  // kv's q2k entries are entries[unit * entries_per_unit + offsets[unit * (nkv + 1) + kv] ...
  // + offsets[... + kv + 1]), ascending, each encoded as qb << slot_bits | slot (the q block and
  // the entry's place in its q2k list: where the pair's stored dS tile goes; a shift, not a product
  // by max_k, so that decoding it costs two instructions, not a division, per tile).
  const int32_t* inv_offsets;
  const int32_t* inv_entries;
  int64_t inv_entries_per_unit;
  int32_t slot_bits;  // the least k with 2^k >= max_k
  // The dK/dV kernels' order of kv blocks (fva_vsa_invert_order, backward only): for kv unit
  // (b, kv head) u, the x-th block of the launch takes kv block kv_order[u * num_kv_blocks + x],
  // the blocks with the most (q block, kv block) pairs first. Null: block x takes kv block x.
  const int32_t* kv_order;
};

// The VSA layer's backward (SPEC 3b) has the fine branch's kernels write its dq, dk and dv: every
// row gains the term of its 64-token block, the gradient the block's mean passes back (its coarse
// gradient over the block's size, rounded to the dtype; -0 for a block of size 0), added after the
// fine gradient is rounded to the dtype, as FastVideo's autograd adds the two tensors:
// dx = dtype(dtype(fine) + term[block]). The VSA backward's kernels that write dq, dk or dv honour
// it (sm90/dkdv_epilogue.cuh, sm90/dq_epilogue.cuh, portable/attention_backward.cuh); null terms:
// the VSA (or QAT) backward alone. With terms those kernels first compare the layer's reserve
// record and write nothing when it is not their call's (check.stored null: nothing to compare).
struct BlockTerms {
  const void* dq;  // [B, Hq, num_q_blocks, D], the dtype, contiguous
  const void* dk;  // [B, Hkv, num_kv_blocks, D]
  const void* dv;  // [B, Hkv, num_kv_blocks, D]
  LayerReserveCheck check;
  // Nonzero: the kernels just before this launch in the call write the terms and nothing else it
  // reads, and everything else it reads was complete when it was launched (the layer's backward:
  // its coarse backward's q side lets the kv side launch only once the gate pass has completed,
  // and this kernel launches only once every block of the kv side runs). The kernel then runs
  // beside them and waits for them only in its epilogue, before its record check, which every
  // storing thread reaches, so it still completes after them (primitives/kernel_chain.cuh,
  // runs_beside_prior_kernels below). The host keeps it for the first gradient kernel of an sm_90a
  // backward and clears it for the others.
  int32_t written_beside;
};

// Which key (forward, dQ) or query (dK/dV) tiles a block visits, and how they are masked.
enum : int32_t { kKindQat = 0, kKindVsa = 1 };

struct AttentionParams {
  Tensor4 q, k, v;       // what the products use: fake-quantized / smoothed copies or the inputs
  Tensor4 o, o_hp;       // forward outputs (o_hp.data null: not wanted)
  Tensor3 lse;           // forward output, backward input
  Tensor4 o_for_bwd, dout;
  Tensor4 dq, dk, dv;
  float* delta;          // backward: [B, Hq, Sq] contiguous fp32 in the workspace
  // Set when Delta runs beside the k2q inverse (VSA backward): the count of Delta's blocks that
  // have written their rows, zeroed before the call's first kernel.
  int32_t* delta_done;
  const float* k_mean;   // QAT smooth_k: [D] fp32 (dtype-rounded), null otherwise
  int32_t B, Hq, Hkv, Sq, Skv;
  float scale;           // softmax scale
  float scale_log2;      // scale * log2(e), rounded once to fp32 as the CPU reference does
  int32_t causal;        // QAT
  int32_t p_scale;       // QAT: FVA_SCALE_BLOCK / TILE / ROW for P
  int32_t quantize_p;    // QAT backward: dV from FQ_P(P) (the forward's is a template parameter)
  VsaLists vsa;
  BlockTerms terms;      // VSA backward: the layer's block terms (null: none)
  // The dK/dV launch's grid (schedules/dkdv_grid.cuh): 0, x the key block's rank and y the
  // (b, kv head) unit; 1, x the unit and y the rank. Set by the host for VSA only.
  int32_t kv_units_first;
};

// A CUDA tensor map (the driver's CUtensorMap: 128 opaque bytes, 64-byte aligned), encoded on the
// host with cuTensorMapEncodeTiled and passed to a kernel by value for its TMA loads.
struct alignas(64) TensorMap {
  uint64_t opaque[16];
};

// The VSA layer's output pass (SPEC 3b step 5) fused into the sm_90a VSA forward's epilogue, for
// the layer's calls: out = out_c[block] * gate + out_s, out_s being the o tile the epilogue stages
// for its store (sm90/fused_layer_gate.cuh). vsa_layer/gate.cu is the same pass on its own, for
// the portable kernels. out.data null: no fused pass (every call but the layer's).
struct Sm90FusedLayerGate {
  Tensor4 gate;  // data null: no gate
  Tensor4 out;   // data null: no fused pass
  // gate and out as 4-d maps like Sm90ForwardParams' (boxes of 64 columns x 64 rows, 128-byte
  // swizzle): the forward loads the block's gate rows into its K tile once the last S has read it,
  // and stores out from its V tile once the last P·V has read it (sm90/fused_layer_gate.cuh).
  TensorMap gate_map, out_map;
  const void* out_c;  // [B, Hq, nq, D], contiguous
  int32_t nq;
  // The forward's last kernel writes the reserve's whole record (block (0, 0), thread 0).
  LayerReserveHeader* record;
  LayerReserveHeader record_value;
  // Nonzero: the kernel just before the forward in the call writes out_c and nothing else the
  // forward reads, and lets the forward launch only after its own wait, so everything else the
  // forward reads was complete at its launch (the layer's coarse output, vsa_layer/coarse_forward.cu).
  // The forward then runs beside it and waits for it only before its epilogue reads out_c
  // (LayerOutputStage, sm90/fused_layer_gate.cuh), which every block reaches, so it still
  // completes after it.
  int32_t out_c_beside;
};

// The sm_90a forward (kernels/sm90/): the portable parameters plus TMA maps of the tensors the
// products read, each 4-d over (D, S, H, B) with boxes of 64 columns x 64 rows, 128-byte swizzle.
// The VSA forward also stores o through a map (the QAT forward, whose outputs are o and o_hp,
// stores by its threads and leaves it unset).
struct Sm90ForwardParams {
  AttentionParams a;
  TensorMap q, k, v;
  TensorMap o;
  // The QAT forward's blocks (its grid is one-dimensional; the VSA forward leaves these unset).
  // Query tile t (of 64 x consumers rows) is row tile t % q_tiles of (b, q head) t / q_tiles.
  // Blocks [0, split_first) run tiles [0, split_first) whole; the blocks after them split the
  // tiles from split_first on, split_pieces adjacent blocks per tile, each over a contiguous share
  // of the key tiles (the tail split: src/cuda/sm90_kernels.cpp plans it, so that the grid's last
  // wave is not a partial one). Every piece but a tile's last writes its running state to
  // split_partials and raises its flag in split_flags (zeroed before the launch); the last piece
  // waits for them, merges them and writes the outputs (sm90/forward_split.cuh).
  int32_t q_tiles;
  // 1, or 2: the grid runs in clusters of two blocks, two neighbouring query tiles of one (b, q
  // head) over the same key tiles, each block's producer loading half of every K/V stage (K, or
  // V) into both blocks' rings by TMA multicast (sm90/attention_forward.cuh). The block
  // order of the split tiles' pieces depends on it (shared/forward_split_plan.h).
  int32_t cluster;
  int32_t split_first;   // the tiles' count when nothing is split
  int32_t split_pieces;  // 1, or 2..kMaxForwardSplitPieces (shared/forward_split_plan.h)
  float* split_partials;  // sm90_forward_partial_floats per thread and consumer, per piece
  uint32_t* split_flags;  // one per (split tile, piece but the last, consumer)
  // Quantized P: a piece but the last first publishes its keys' row maxima (2 floats per consumer
  // thread) and raises its flag, so that every later piece starts FQ_P's running max from the
  // max over every earlier key (SPEC's m'). Laid out as split_flags.
  float* split_maxima;
  uint32_t* split_max_flags;
  // The VSA forward only: the layer's output pass, fused (out.data null: none).
  Sm90FusedLayerGate layer_gate;
};

// The sm_90a backward's dQ and dK/dV: the portable parameters plus TMA maps of what they read.
// The dK/dV kernel that also reduces dQ (handles that are not deterministic) adds into dq_accum and
// ds_rowsum in the workspace (sm90/dq_accumulator.cuh: their layout); null otherwise.
struct Sm90BackwardParams {
  AttentionParams a;
  TensorMap q, k, v, dout;
  float* dq_accum;   // [B, Hq, q_tiles, 64 x D] fp32, zeroed before the kernel
  float* ds_rowsum;  // [B, Hq, q_tiles, 64] fp32, zeroed before the kernel
  int32_t q_tiles;   // ceil(Sq / 64)
  // The stored-dS backward (sm90/attention_dq_from_ds.cuh): the dK/dV kernel writes every pair's
  // dS tile here (sm90_ds_tile_bytes each, wgmma fragment order) and the dQ kernel reads them back.
  // A launch covers the (b, kv head) units [kv_unit0, kv_unit0 + gridDim.y) and their q heads; q
  // unit u (= b Hq + h) holds ds_q_tiles x ds_slots tiles (VSA: q blocks x q2k slots; QAT: query
  // tiles x key tiles), from tile ((u - kv_unit0 Hq / Hkv) ds_q_tiles) ds_slots on.
  void* ds_tiles;
  int32_t kv_unit0, ds_q_tiles, ds_slots;
};

// Whether a launch runs beside the kernels before it in its call until it reads what they write
// (BlockTerms::written_beside, Sm90FusedLayerGate::out_c_beside): the generated kernels' entry
// asks (kernels/CMakeLists.txt). Only the sm_90a backward's kernels and the sm_90a VSA forward of
// the layer's call honour it; every other parameter block waits at entry.
template <typename Params>
FVA_HD bool runs_beside_prior_kernels(const Params&) {
  return false;
}
FVA_HD bool runs_beside_prior_kernels(const Sm90BackwardParams& p) {
  return p.a.terms.written_beside != 0;
}
FVA_HD bool runs_beside_prior_kernels(const Sm90ForwardParams& p) {
  return p.layer_gate.out_c_beside != 0;
}

// NVFP4 fake quantization of the tokens of [B, H, S, D] tensors (Q/K/V preparation and
// fva_nvfp4_fake_quantize): groups of 16 along D, tiles of `tile_tokens` tokens per (b, h). One
// launch serves up to kMaxQuantizeJobs tensors (QAT's Q, K and V), a warp per tile of one of them:
// one launch's ramp and tail instead of three.
struct QuantizeJob {
  Tensor4 x, y;
  int32_t H, S;
  int32_t quantize;       // 0: copy (after the optional mean subtraction) without quantizing
  int32_t owned_order;    // 1: y's rows in the Hopper QAT forward's key order (shared/key_order.h),
                          // each (b, h) padded with zero rows to a multiple of 64; y != x
  const float* mean;      // [D] fp32 subtracted before anything (smooth_k), or null
  int64_t first_tile;     // the launch's first warp-tile of this job (jobs in order, from 0)
};
constexpr int kMaxQuantizeJobs = 3;
// The 16-element groups per lane a warp of the quantization kernel loads, as raw words, before it
// converts any (one memory round trip per batch). Block mode has no tile, so its work unit is one
// batch of 32 x 2 groups (8 tokens at D = 128): few registers, many warps per SM, since the
// conversion and not the memory bounds the kernel. Tile mode's tiles
// (SPEC section 1: 32 tokens) go in batches of 8 groups per lane, one batch per tile at D = 128.
constexpr int kQuantizeBlockBatch = 2;
constexpr int kQuantizeTileBatch = 8;
constexpr int quantize_block_unit_tokens(int64_t D) {
  return D >= 32 * kQuantizeBlockBatch * 16 ? 1 : static_cast<int>(32 * kQuantizeBlockBatch * 16 / D);
}
struct QuantizeParams {
  QuantizeJob job[kMaxQuantizeJobs];
  int32_t num_jobs;
  int32_t B, D;
  int32_t tile_tokens;
  int32_t scale_mode;     // FVA_SCALE_BLOCK or FVA_SCALE_TILE
  int64_t tiles;          // warp-tiles over every job
};

// Per-channel mean of k over (B, H, S) in two deterministic steps: fixed chunks of tokens summed in
// double, then the chunks summed in order.
struct MeanParams {
  Tensor4 x;
  int32_t B, H, S, D;
  int32_t chunk_tokens;   // tokens per partial sum
  double* partial;        // [num_chunks, D]
  int32_t num_chunks;     // B * H * ceil(S / chunk_tokens)
  float* mean;            // [D], rounded to the dtype
};

// The most kv blocks fva_vsa_invert_order orders (16 KiB of weights in shared memory: 262144 tokens
// per sequence); past that the dK/dV blocks run in index order.
constexpr int kVsaOrderMaxKvBlocks = 4096;

// Whether the VSA backward's dK/dV grid runs rank by rank across the (b, kv head) units
// (AttentionParams::kv_units_first, schedules/dkdv_grid.cuh): where its blocks are ordered (up to
// kVsaOrderMaxKvBlocks) and the call's Q and dO (2 bytes an element) fit in the device's L2
// together, so that the blocks resident together may read every unit's instead of a few units'
// at no DRAM cost. l2_bytes 0: unknown, unit by unit.
static_assert(kVsaOrderMaxKvBlocks <= 65535, "an ordered grid's ranks fit in its y");
inline bool vsa_dkdv_units_first(int64_t B, int64_t Hq, int64_t num_q_blocks, int64_t D,
                                 int64_t num_kv_blocks, int64_t l2_bytes) {
  const int64_t query_side_bytes = 2 * B * Hq * num_q_blocks * 64 * D * 2;
  return num_kv_blocks <= kVsaOrderMaxKvBlocks && l2_bytes > 0 && query_side_bytes <= l2_bytes;
}

// Inversion of the q2k lists per (b, h) unit (kernels/indices/vsa_invert.cu). A unit's q blocks are cut
// into chunks of consecutive rows; the inverse counts each chunk's entries per kv block (the tally),
// scans the tally kv-major, and then places each chunk's entries in row order, so every kv block's
// segment comes out ascending without a sort.
//
// A chunk holds about kInvertChunkEntries list entries, or num_kv_blocks when that is more: the tally
// (num_kv_blocks per chunk) then stays within the entries' own size plus one row of kv blocks.
constexpr int kInvertChunkEntries = 2048;
// The kv blocks whose counters or cursors one shared-memory pass holds (8 KiB per array); more kv
// blocks take more passes over the chunk.
constexpr int kInvertKvWindow = 2048;
// The threads of the tally and place kernels' blocks, and the entries fva_vsa_invert_place sorts
// into its kv blocks' runs at a time (a whole chunk, mostly).
constexpr int kInvertThreads = 256;
constexpr int kInvertPlaceBatch = 2048;

// Short lists take one kernel instead (fva_vsa_invert_unit): a block of kInvertUnitThreads per
// (b, kv head) unit inverts the lists of the unit's `group` q heads one after another, their kv
// blocks' counters and one q head's entries in shared memory, and orders the unit's dK/dV blocks.
// Where a unit holds a few thousand entries (S <= 8192 at 25% density, the VSA layer at 32
// frames) the chunked kernels' four launches cost more than the work, and one block does it all.
// Its cost grows with the entries (one block's place batches run one after another), so a unit of
// more than kInvertUnitMaxEntries (over its q heads), or of more than kInvertKvWindow kv blocks,
// takes the chunked kernels, which spread it over many blocks (measured on an H100 with
// tools/device/inverse_times.sh: the one block is the faster below this limit, nearly twice as
// slow at twice it).
constexpr int kInvertUnitThreads = 1024;
constexpr int64_t kInvertUnitMaxEntries = 8192;
inline bool invert_in_one_block(int64_t group, int64_t num_q_blocks, int64_t num_kv_blocks,
                                int64_t max_k) {
  return num_kv_blocks <= kInvertKvWindow && group * num_q_blocks * max_k <= kInvertUnitMaxEntries;
}
// Its dynamic shared memory: four arrays of num_kv_blocks counters (counts, bucket bases, cursors,
// the unit's pair counts), the place buckets (kInvertPlaceBatch), and one q head's entries as
// 16-bit kv blocks: at most 56 KiB.
inline int64_t invert_unit_smem_bytes(int64_t num_kv_blocks, int64_t num_q_blocks, int64_t max_k) {
  return 4 * 4 * num_kv_blocks + 4 * kInvertPlaceBatch + (2 * num_q_blocks * max_k + 3) / 4 * 4;
}

struct InvertChunking {
  int32_t rows_per_chunk, num_chunks;
};
inline InvertChunking invert_chunking(int64_t num_q_blocks, int64_t num_kv_blocks, int64_t max_k) {
  const int64_t per_chunk = num_kv_blocks > kInvertChunkEntries ? num_kv_blocks : kInvertChunkEntries;
  int64_t rows = max_k > 0 ? (per_chunk + max_k - 1) / max_k : num_q_blocks;
  if (rows > num_q_blocks) rows = num_q_blocks;
  if (rows < 1) rows = 1;
  return {static_cast<int32_t>(rows), static_cast<int32_t>((num_q_blocks + rows - 1) / rows)};
}

struct InvertParams {
  VsaLists lists;
  int32_t B, H;
  int32_t skip_empty_blocks;  // 1: leave out entries whose kv block has no real token (backward)
  int32_t rows_per_chunk, num_chunks;  // invert_chunking
  // [B * H, num_kv_blocks, num_chunks]: the chunk's entries per kv block (fva_vsa_invert_tally),
  // then, scanned in place (fva_vsa_invert_scan), where they start in the unit's entries.
  int32_t* tally;
  int32_t* offsets;           // [B * H * (num_kv_blocks + 1)]
  int32_t* entries;           // [B * H * num_q_blocks * max_k], each segment ascending
  // The backward's dK/dV block order (fva_vsa_invert_order; null: not built): [B * H / group,
  // num_kv_blocks], the kv blocks of each (b, kv head) by descending pair count over its `group`
  // q heads.
  int32_t* kv_order;
  int32_t group;
  // With kv_order: Delta's completion count (AttentionParams::delta_done) and the count it
  // reaches, which fva_vsa_invert_order waits for before it exits, so that dK/dV, chained after
  // it, reads a finished Delta (null: Delta runs later in the chain).
  const int32_t* delta_done;
  int32_t delta_blocks;
  // fva_vsa_invert_indices outputs (null for the backward's internal inverse)
  int32_t* k2q_idx;           // [B, H, num_kv_blocks, num_q_blocks]
  int64_t k2q_stride_b, k2q_stride_h, k2q_stride_kv;
  int32_t* k2q_num;           // [B, H, num_kv_blocks]
  int64_t k2q_num_stride_b, k2q_num_stride_h, k2q_num_stride_kv;
};

}  // namespace fva::kern
