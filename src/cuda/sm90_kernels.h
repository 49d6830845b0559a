// The Hopper-native kernels (kernels/sm90/): whether a handle may run them, the TMA maps they
// read through, and their launches. The planners (qat_plan.h, vsa_plan.h) decide which of them a
// call runs; the functions here only execute that decision.
#pragma once

#include <cstddef>
#include <cstdint>

#include "handle.h"
#include "shared/kernel_params.h"

namespace fva::cuda {

enum class Sm90Kind { kQat, kVsa };

// Whether `h` may run the sm_90a kernels at head dim D: an sm_90 device whose image is sm_90a, a
// handle that allows native kernels (FVA_KERNELS_AUTO), D 64 or 128, and a driver that encodes TMA
// maps. The one place this is decided.
bool sm90_available(const fva_handle& h, int64_t D);

// Whether the sm_90a QAT kernels that quantize P (the forward, and dK/dV's dV) cover P's scale mode:
// block scales or P unquantized (tile and row P scales run the portable kernels).
bool sm90_covers_p_scale(bool quantize_p, int32_t p_scale);

// The TMA maps of the forward (q, k, v; for VSA also o, which its epilogue stores by the TMA) into
// *params, with the K and V maps over kv_rows rows per (b, head): a.Skv, or (the QAT forward's
// quantized K and V, stored in its key order, shared/key_order.h) Skv padded to whole 64-key tiles.
// False when the driver refuses a map (a stride the TMA cannot address: then the portable kernels,
// which read through plain pointers, run the call).
bool sm90_encode_forward(Sm90Kind kind, const kern::AttentionParams& a, int64_t D, int64_t kv_rows,
                         kern::Sm90ForwardParams* params);

// The TMA maps of the VSA layer's gate and out ([B, Hq, Sq, D], as q) into *gate, for the output
// pass the sm_90a VSA forward fuses (sm90/fused_layer_gate.cuh); false where the driver refuses
// one (then the layer's separate gate pass runs).
bool sm90_encode_layer_gate(const kern::AttentionParams& a, int64_t D,
                            kern::Sm90FusedLayerGate* gate);

// The TMA maps of the backward (q, k, v, dout) into *params; false as above. a.delta and the
// gradient outputs must be set.
bool sm90_encode_backward(const kern::AttentionParams& a, int64_t D,
                          kern::Sm90BackwardParams* params);

// The QAT forward's tail split (sm90/forward_split.cuh): its query tiles (64 x consumers rows of
// every (b, q head)), the first one split, and into how many pieces over the key tiles, with the
// sizes of the pieces' states and flags in the workspace.
struct Sm90ForwardSplit {
  int64_t tiles = 0;  // the forward's query tiles
  int64_t first = 0;  // tiles [first, tiles) are split; first == tiles: none
  int pieces = 1;
  int64_t D = 0;
  bool quantize_p = false;
  size_t partial_floats() const;  // the pieces' states, in floats
  size_t flag_words() const;      // their flags; as many again for the maxima's
  size_t maxima_floats() const;   // quantized P: the pieces' keys' row maxima
};
// The split of a QAT forward on `h` (the handle's qat_forward_split option, else the plan of
// shared/forward_split_plan.h); none when causal.
Sm90ForwardSplit sm90_plan_forward_split(const fva_handle& h, int64_t B, int64_t Hq, int64_t Sq,
                                         int64_t Skv, int64_t D, bool causal, bool quantize_p);

// Where the split's buffers lie in the call's workspace.
struct Sm90SplitBuffers {
  float* partials = nullptr;
  uint32_t* flags = nullptr;  // 2 flag_words(): the states', then the maxima's
  float* maxima = nullptr;
};

// Whether the QAT forward's grid may run in clusters of two blocks that share their K/V loads
// (sm90/attention_forward.cuh): the handle allows it, the rows of a cluster's two query tiles see
// the same keys (not causal), every (b, q head) has an even count of query tiles, as do the split
// tiles (each pair of them splits into the same pieces), and the driver launches clusters. The
// launch still checks that the device fits enough clusters at once to keep every SM busy.
bool sm90_forward_clusters_allowed(const fva_handle& h, const Sm90ForwardSplit& split, int64_t Sq,
                                   bool causal);

// Zeroes the split's flags on `stream` (nothing when it splits nothing): before the call's first
// kernel, so that the call's kernels chain (kernel_images.h, LaunchChain) without a memset between.
void sm90_forward_split_reset(const Sm90ForwardSplit& split, const Sm90SplitBuffers& buffers,
                              void* stream);

// The VSA forward (sm90/attention_forward_compact.cuh), its maps encoded.
void sm90_vsa_forward_launch(const fva_handle& h, const kern::Sm90ForwardParams& params, int64_t D,
                             int32_t dtype, void* stream);
// The QAT forward (sm90/attention_forward.cuh), its maps encoded, with `split` (its flags zeroed
// by sm90_forward_split_reset) and in clusters where `clusters_allowed` and the device fits them.
void sm90_qat_forward_launch(const fva_handle& h, const kern::Sm90ForwardParams& params, int64_t D,
                             int32_t dtype, bool quantize_p, const Sm90ForwardSplit& split,
                             const Sm90SplitBuffers& buffers, bool clusters_allowed, void* stream);

// dQ by recomputing S and dP (sm90/attention_dq.cuh).
void sm90_dq_launch(const fva_handle& h, Sm90Kind kind, const kern::Sm90BackwardParams& params,
                    int64_t D, int32_t dtype, void* stream);
// dK/dV beside it (sm90/attention_dkdv.cuh); QAT's kernel reads a.quantize_p (FQ_P for dV).
void sm90_dkdv_launch(const fva_handle& h, Sm90Kind kind, const kern::Sm90BackwardParams& params,
                      int64_t D, int32_t dtype, void* stream);

// The stored-dS backward (QAT and VSA): the dK/dV kernel writes every (query tile, key tile) pair's
// dS tile (kern::sm90_ds_tile_bytes) to the workspace and a dQ kernel sums dS K from them
// (sm90/attention_dq_from_ds.cuh), instead of a dQ kernel that recomputes S and dP. Bitwise
// reproducible on every handle. The tiles of a problem can be large (8 KiB a pair), so they take
// at most the handle's ds_budget_mib of workspace: the (b, kv head) units run in chunks that fit,
// and a problem whose single unit does not fit runs without stored dS.
struct Sm90DsChunks {
  int64_t kv_units_per_chunk = 0;  // 0: no stored dS for this call
  size_t bytes = 0;                // the tiles' workspace (one chunk's)
};
// The chunks of `kv_units` (b, kv head) units of `tiles_per_kv_unit` tiles each (every q head of
// the unit's group) within `budget_bytes`.
Sm90DsChunks sm90_ds_chunks(int64_t budget_bytes, int64_t kv_units, int64_t tiles_per_kv_unit);
// Chunk by chunk, dK/dV of the chunk's units (storing their dS tiles in `ds_tiles`, a q unit's as
// ds_q_tiles x ds_slots tiles: VSA's q blocks x q2k slots, QAT's query tiles x key tiles), then dQ
// of their q heads.
void sm90_stored_ds_backward_launch(const fva_handle& h, Sm90Kind kind,
                                    kern::Sm90BackwardParams& params, int64_t D, int32_t dtype,
                                    const Sm90DsChunks& chunks, void* ds_tiles, int32_t ds_q_tiles,
                                    int32_t ds_slots, void* stream);

// The fused backward (QAT at D = 128, handles that are not deterministic, beyond the stored-dS
// budget): dK/dV reduces dQ into an fp32 accumulator (kern::sm90_dq_accumulator_bytes of
// workspace; fp32 reductions in L2 whose order varies run to run), then a kernel converts it.
// Zero the accumulator before the call's first kernel: a memset breaks the chain of programmatic
// launches (kernel_images.h), so it goes where there is no chain yet to break.
void sm90_fused_backward_reset(float* accumulator, int64_t B, int64_t Hq, int64_t Sq, int64_t D,
                               void* stream);
void sm90_fused_backward_launch(const fva_handle& h, Sm90Kind kind,
                                kern::Sm90BackwardParams& params, int64_t D, int32_t dtype,
                                float* accumulator, void* stream);

}  // namespace fva::cuda
