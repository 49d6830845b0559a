// The Hopper-native kernels (kernels/sm90/): when a call may use them, and their launches. QAT
// attention and VSA ask here first and fall back to the portable kernels when the answer is no:
// the forward, and the backward's dQ and dK/dV (the Delta pre-pass stays portable).
#pragma once

#include <cstdint>

#include "shared/kernel_params.h"
#include "handle.h"

namespace fva::cuda {

enum class Sm90Kind { kQat, kVsa };

// Encodes the TMA maps of a.q, a.k, a.v into *params and returns true when the sm_90a forward can
// run this call: an sm_90 device, a handle that allows native kernels (FVA_KERNELS_AUTO), D 64 or
// 128, and tensors the TMA can address (the driver accepts their maps). QAT also needs P in block
// scales or unquantized (its tile and row P scales run on the portable kernel). The K and V maps
// cover kv_rows rows per (b, head): a.Skv, or (the QAT forward's quantized K and V, stored in its
// key order, shared/key_order.h) Skv padded to whole 64-key tiles.
bool sm90_forward_prepare(const fva_handle& h, Sm90Kind kind, const kern::AttentionParams& a,
                          int64_t D, bool quantize_p, int32_t p_scale,
                          kern::Sm90ForwardParams* params, int64_t kv_rows);

// The QAT forward's tail split (sm90/forward_split.cuh): its query tiles (64 x 2 rows of
// every (b, q head)), the first one split, and into how many pieces over the key tiles. The
// workspace holds the pieces' states and flags (sizes below; the size query and the call plan
// alike, and a call whose forward does not run natively leaves them unused).
// Planned when the native forward may run the call and it is not causal, by
// kern::plan_forward_split (shared/forward_split_plan.h: the tail past the last full wave of one
// block per SM, in the count of pieces its model of the last wave likes best, or none).
// FVATTN_QAT_SPLIT overrides the plan (under the same conditions) for tests and A/B runs: 0 (or
// 1) splits nothing, N >= 2 splits the tail into min(N, key tiles, 8) pieces (the last wave's
// tiles; every tile when they fill less than one).
struct Sm90ForwardSplit {
  int64_t tiles = 0;  // 0: no QAT forward on the native kernel is planned
  int64_t first = 0;  // tiles [first, tiles) are split; first == tiles: none
  int pieces = 1;
  size_t partial_floats() const;  // the pieces' states, in floats
  size_t flag_words() const;      // their flags; as many again for the maxima's
  size_t maxima_floats() const;   // quantized P: the pieces' keys' row maxima
  float* partials = nullptr;      // the workspace's, set by the call
  uint32_t* flags = nullptr;      // 2 flag_words(): the states', then the maxima's
  float* maxima = nullptr;
  int64_t D = 0;
  bool quantize_p = false;
};
Sm90ForwardSplit sm90_qat_forward_split(const fva_handle& h, int64_t B, int64_t Hq, int64_t Sq,
                                        int64_t Skv, int64_t D, bool causal, bool quantize_p,
                                        int32_t p_scale);

// Zeroes the split's flags on `stream` (nothing when it splits nothing): before the call's first
// kernel, so that the call's kernels chain (kernel_images.h, LaunchChain) without a memset between.
void sm90_forward_split_reset(const Sm90ForwardSplit& split, void* stream);

// Launches the forward prepared above (asynchronous, on `stream`); the QAT forward with `split`
// (its buffers set, its flags zeroed by sm90_forward_split_reset) splits the tiles it plans.
void sm90_forward_launch(const fva_handle& h, Sm90Kind kind, const kern::Sm90ForwardParams& params,
                         int64_t D, int32_t dtype, bool quantize_p, void* stream,
                         const Sm90ForwardSplit* split = nullptr);

// The backward: encodes the TMA maps of a.q, a.k, a.v and a.dout into *params and returns true when
// the sm_90a backward kernels can run this call (the forward's conditions, any P scale mode: dQ
// does not quantize P). a.delta and the gradient outputs must be set.
bool sm90_backward_prepare(const fva_handle& h, const kern::AttentionParams& a, int64_t D,
                           kern::Sm90BackwardParams* params);

// dQ, prepared above (asynchronous, on `stream`).
void sm90_dq_launch(const fva_handle& h, Sm90Kind kind, const kern::Sm90BackwardParams& params,
                    int64_t D, int32_t dtype, void* stream);

// Whether the sm_90a dK/dV kernel covers the call: QAT's FQ_P for dV only in block scales (tile
// and row P scales run on the portable kernel).
bool sm90_dkdv_covers(Sm90Kind kind, bool quantize_p, int32_t p_scale);
// dK/dV, prepared above; QAT's kernel reads a.quantize_p (FQ_P for dV) at run time.
void sm90_dkdv_launch(const fva_handle& h, Sm90Kind kind, const kern::Sm90BackwardParams& params,
                      int64_t D, int32_t dtype, void* stream);

// Whether a backward on `h` may reduce dQ inside the sm_90a dK/dV kernel (fp32 reductions in L2,
// in an order that varies run to run) instead of running the dQ kernel: QAT at D = 128 on handles
// that are not deterministic, when the native kernels may run; the QAT backward does so only when
// it does not store dS (sm90_ds_chunks below, which is faster and reproducible). It then needs
// kern::sm90_dq_accumulator_bytes of workspace more (its size query asks here too). (VSA keeps the
// stored-dS backward below: its kv blocks have lists of their own, so a block cannot pair two of
// them, and with one 64-key tile per block the reductions cost more than they save: docs/perf.md.)
bool sm90_fuses_dq(const fva_handle& h, Sm90Kind kind, int64_t D);
// The stored-dS backward (QAT and VSA, sm_90a): the dK/dV kernel writes every (query tile, key
// tile) pair's dS tile (kern::sm90_ds_tile_bytes) to the workspace and a dQ kernel sums dS K from
// them (sm90/attention_dq_from_ds.cuh), instead of a dQ kernel that recomputes S and dP (or, QAT's
// fast handles, reductions into an fp32 accumulator). Bitwise reproducible on every handle. The
// tiles of a problem can be large (8 KiB a pair), so they take at most FVATTN_DS_BUDGET_MIB of
// workspace (default 2048; 0: none): the (b, kv head) units run in chunks that fit it, and a
// problem whose single unit does not fit runs without stored dS.
struct Sm90DsChunks {
  int64_t kv_units_per_chunk = 0;  // 0: no stored dS for this call
  size_t bytes = 0;                // the tiles' workspace (one chunk's)
};
// The chunks of a call on `h` with `kv_units` (b, kv head) units of `tiles_per_kv_unit` tiles
// each (every q head of the unit's group): none when the native kernels do not run it. Throws
// FVA_ERR_INVALID_ARGUMENT for a malformed FVATTN_DS_BUDGET_MIB.
Sm90DsChunks sm90_ds_chunks(const fva_handle& h, int64_t D, int64_t kv_units,
                            int64_t tiles_per_kv_unit);
// The stored-dS backward, prepared above: chunk by chunk, dK/dV of the chunk's units (storing
// their dS tiles in `ds_tiles`, a q unit's as ds_q_tiles x ds_slots tiles: VSA's q blocks x q2k
// slots, QAT's query tiles x key tiles), then dQ of their q heads.
void sm90_stored_ds_backward_launch(const fva_handle& h, Sm90Kind kind,
                                    kern::Sm90BackwardParams& params, int64_t D, int32_t dtype,
                                    const Sm90DsChunks& chunks, void* ds_tiles, int32_t ds_q_tiles,
                                    int32_t ds_slots, void* stream);

// Zeroes the fused backward's accumulator (sm90_dq_accumulator_bytes(B, Hq, Sq, D) of workspace).
// Call it before the call's first kernel: a memset breaks the chain of programmatic launches
// (kernel_images.h), so it goes where there is no chain yet to break.
void sm90_fused_backward_reset(float* accumulator, int64_t B, int64_t Hq, int64_t Sq, int64_t D,
                               void* stream);

// The fused backward, prepared above, with `accumulator` (zeroed by sm90_fused_backward_reset):
// runs dK/dV with dQ into it, converts it into a.dq.
void sm90_fused_backward_launch(const fva_handle& h, Sm90Kind kind,
                                kern::Sm90BackwardParams& params, int64_t D, int32_t dtype,
                                float* accumulator, void* stream);

}  // namespace fva::cuda
