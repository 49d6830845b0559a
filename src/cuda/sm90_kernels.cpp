#include "sm90_kernels.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

#include "kernel_images.h"
#include "kernel_name.h"
#include "params.h"
#include "shared/forward_split_plan.h"
#include "shared/kernel_traits.h"

namespace fva::cuda {
namespace {

// cuda.h's enumerators for the maps (driver ABI).
constexpr int kTmaUint16 = 1;        // CU_TENSOR_MAP_DATA_TYPE_UINT16: bf16 and fp16 alike
constexpr int kTmaNoInterleave = 0;  // CU_TENSOR_MAP_INTERLEAVE_NONE
constexpr int kTmaSwizzle128 = 3;    // CU_TENSOR_MAP_SWIZZLE_128B
constexpr int kTmaL2Promote128 = 2;  // CU_TENSOR_MAP_L2_PROMOTION_L2_128B
constexpr int kTmaZeroFill = 0;      // CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: out of bounds reads 0

// The kernels' shapes (shared/kernel_traits.h, which kernels/instantiations.txt instantiates).
constexpr int kQatConsumers = kern::kSm90ForwardConsumers;
constexpr int kQatStages = kern::kSm90ForwardStages;
constexpr int kDkdvStages = kern::kSm90DkdvStages;
constexpr int kDsStages = kern::kSm90DsStages;

// A [B, H, S, D] tensor as a 4-d map over (D, S, H, B), boxes of 64 columns x 64 rows.
bool encode(const Api& api, const kern::Tensor4& t, int64_t B, int64_t H, int64_t S, int64_t D,
            kern::TensorMap* map) {
  const unsigned long long dims[4] = {static_cast<unsigned long long>(D),
                                      static_cast<unsigned long long>(S),
                                      static_cast<unsigned long long>(H),
                                      static_cast<unsigned long long>(B)};
  const unsigned long long strides[3] = {static_cast<unsigned long long>(t.stride_s) * 2,
                                         static_cast<unsigned long long>(t.stride_h) * 2,
                                         static_cast<unsigned long long>(t.stride_b) * 2};
  const unsigned box[4] = {64, 64, 1, 1};
  const unsigned element_strides[4] = {1, 1, 1, 1};
  return api.cuTensorMapEncodeTiled(map, kTmaUint16, 4, t.data, dims, strides, box,
                                    element_strides, kTmaNoInterleave, kTmaSwizzle128,
                                    kTmaL2Promote128, kTmaZeroFill) == CUDA_SUCCESS;
}

// The driver's API when it encodes TMA maps.
const Api* tma_api() {
  const Api* api = cuda::api();
  return api != nullptr && api->cuTensorMapEncodeTiled != nullptr ? api : nullptr;
}

// The launch of a kernel with one 128-thread block per 64-row query tile of `q_units` (b, q head)
// units (the compact kernels of sm90/compact_tiles.cuh: the VSA forward and the dQ kernel
// that recomputes S and dP; dQ from stored dS; the fused backward's dQ convert).
Launch query_tile_launch(const kern::AttentionParams& a, int64_t q_units, size_t smem) {
  Launch l;
  l.grid_x = blocks_for(a.Sq, 64);
  l.grid_y = static_cast<unsigned>(q_units);
  l.block = kern::kSm90CompactThreads;
  l.smem = smem;
  return l;
}
// A compact kernel over every (b, q head), `tiles` tiles of shared memory (and a region of ones).
Launch compact_launch(const kern::AttentionParams& a, int64_t D, int tiles,
                      bool ones_region = false) {
  return query_tile_launch(
      a, static_cast<int64_t>(a.B) * a.Hq,
      static_cast<size_t>(kern::sm90_compact_smem_bytes(static_cast<int>(D), tiles, ones_region)));
}

}  // namespace

bool sm90_available(const fva_handle& h, int64_t D) {
  return h.kernels == FVA_KERNELS_AUTO && h.image == "sm_90a" && (D == 64 || D == 128) &&
         tma_api() != nullptr;
}

bool sm90_covers_p_scale(bool quantize_p, int32_t p_scale) {
  return !quantize_p || p_scale == FVA_SCALE_BLOCK;
}

bool sm90_encode_forward(Sm90Kind kind, const kern::AttentionParams& a, int64_t D, int64_t kv_rows,
                         kern::Sm90ForwardParams* params) {
  const Api* api = tma_api();
  if (api == nullptr) return false;
  params->a = a;
  params->q_tiles = params->split_first = 0;  // the QAT forward's launch sets them
  params->split_pieces = params->cluster = 1;
  params->split_partials = params->split_maxima = nullptr;
  params->split_flags = params->split_max_flags = nullptr;
  params->layer_gate = {};  // no fused layer pass unless the layer's call sets one
  // (The VSA forward also stores o by the TMA, and has no o_hp.)
  return encode(*api, a.q, a.B, a.Hq, a.Sq, D, &params->q) &&
         encode(*api, a.k, a.B, a.Hkv, kv_rows, D, &params->k) &&
         encode(*api, a.v, a.B, a.Hkv, kv_rows, D, &params->v) &&
         (kind != Sm90Kind::kVsa ||
          (a.o_hp.data == nullptr && encode(*api, a.o, a.B, a.Hq, a.Sq, D, &params->o)));
}

bool sm90_encode_layer_gate(const kern::AttentionParams& a, int64_t D,
                            kern::Sm90FusedLayerGate* gate) {
  const Api* api = tma_api();
  return api != nullptr && gate->out.data != nullptr &&
         encode(*api, gate->out, a.B, a.Hq, a.Sq, D, &gate->out_map) &&
         (gate->gate.data == nullptr || encode(*api, gate->gate, a.B, a.Hq, a.Sq, D, &gate->gate_map));
}

size_t Sm90ForwardSplit::partial_floats() const {
  if (pieces < 2) return 0;
  const int per_thread = kern::sm90_forward_partial_floats(static_cast<int>(D), quantize_p);
  return flag_words() * 128 * static_cast<size_t>(per_thread);
}
size_t Sm90ForwardSplit::flag_words() const {
  return pieces < 2 ? 0 : static_cast<size_t>(tiles - first) * (pieces - 1) * kQatConsumers;
}
size_t Sm90ForwardSplit::maxima_floats() const {
  return quantize_p ? flag_words() * 128 * 2 : 0;
}

Sm90ForwardSplit sm90_plan_forward_split(const fva_handle& h, int64_t B, int64_t Hq, int64_t Sq,
                                         int64_t Skv, int64_t D, bool causal, bool quantize_p) {
  Sm90ForwardSplit s;
  s.D = D;
  s.quantize_p = quantize_p;
  s.tiles = static_cast<int64_t>(blocks_for(Sq, 64 * kQatConsumers)) * B * Hq;
  s.first = s.tiles;
  if (causal) return s;
  // One block per SM (its 384 threads' registers fill one).
  const kern::ForwardSplitPlan plan =
      kern::plan_forward_split(s.tiles, h.device.sm_count, (Skv + 63) / 64, quantize_p,
                               h.tuning.qat_forward_split);
  s.first = plan.first;
  s.pieces = plan.pieces;
  return s;
}

bool sm90_forward_clusters_allowed(const fva_handle& h, const Sm90ForwardSplit& split, int64_t Sq,
                                   bool causal) {
  const int64_t q_tiles = blocks_for(Sq, 64 * kQatConsumers);
  const int64_t split_first = split.pieces > 1 ? split.first : split.tiles;
  return h.tuning.qat_forward_clusters && !causal && q_tiles % 2 == 0 &&
         (split.tiles - split_first) % 2 == 0 && cluster_launch_available();
}

void sm90_forward_split_reset(const Sm90ForwardSplit& split, const Sm90SplitBuffers& buffers,
                              void* stream) {
  if (split.pieces > 1 && buffers.flags != nullptr)
    memset_words(buffers.flags, 0, 2 * split.flag_words(), stream, "the QAT forward's split flags");
}

void sm90_vsa_forward_launch(const fva_handle& h, const kern::Sm90ForwardParams& params, int64_t D,
                             int32_t dtype, void* stream) {
  // sm90/attention_forward_compact.cuh: Q, K, V tiles and the region of ones.
  const KernelName name("fva_sm90_vsa_fwd_", dtype_suffix(dtype), "_d", D);
  launch("sm90", name.c_str(), h.device, compact_launch(params.a, D, 3, /*ones_region=*/true),
         stream, params);
}

void sm90_qat_forward_launch(const fva_handle& h, const kern::Sm90ForwardParams& params, int64_t D,
                             int32_t dtype, bool quantize_p, const Sm90ForwardSplit& split,
                             const Sm90SplitBuffers& buffers, bool clusters_allowed, void* stream) {
  // sm90/attention_forward.cuh: a block per 64 x kQatConsumers query rows of every (b, q head), a
  // producer warpgroup beside the consumers, in a one-dimensional grid (sm90/forward_split.cuh).
  const kern::AttentionParams& a = params.a;
  kern::Sm90ForwardParams P = params;
  const int64_t q_tiles = blocks_for(a.Sq, 64 * kQatConsumers);
  const int64_t tiles = q_tiles * a.B * a.Hq;
  P.q_tiles = static_cast<int32_t>(q_tiles);
  P.split_first = static_cast<int32_t>(tiles);  // (the rest unsplit as sm90_encode_forward left it)
  const bool splits = split.pieces > 1;
  const int64_t blocks = splits ? split.first + (tiles - split.first) * split.pieces : tiles;
  if (blocks > std::numeric_limits<int32_t>::max())
    fail(FVA_ERR_UNSUPPORTED, "q: {} query tiles of 128 rows exceed the native forward's grid",
         tiles);
  if (splits) {
    if (split.tiles != tiles || buffers.partials == nullptr || buffers.flags == nullptr ||
        split.quantize_p != quantize_p || (quantize_p && buffers.maxima == nullptr))
      fail(FVA_ERR_INTERNAL, "the QAT forward's split plan does not match its launch");
    P.split_first = static_cast<int32_t>(split.first);
    P.split_pieces = split.pieces;
    P.split_partials = buffers.partials;
    P.split_flags = buffers.flags;
    P.split_maxima = buffers.maxima;
    P.split_max_flags = buffers.flags + split.flag_words();
    // (Its flags were zeroed by sm90_forward_split_reset, before the call's first kernel.)
  }
  Launch l;
  l.grid_x = static_cast<unsigned>(blocks);
  l.block = kern::kSm90ForwardThreads;
  l.smem = static_cast<size_t>(
      kern::sm90_forward_smem_bytes(static_cast<int>(D), kQatConsumers, kQatStages));
  const KernelName name("fva_sm90_qat_fwd_", dtype_suffix(dtype), "_d", D, quantize_p ? "_q1b" : "_q0");
  // Pairs where the plan allows them and the device fits enough of them to keep every SM busy.
  P.cluster = 1;
  if (clusters_allowed) {
    Launch pairs = l;
    pairs.cluster_x = 2;
    if (kern::forward_clusters_fill_device(
            max_active_clusters("sm90", name.c_str(), h.device, pairs, stream), 2,
            h.device.sm_count))
      P.cluster = 2;
  }
  l.cluster_x = static_cast<unsigned>(P.cluster);
  launch("sm90", name.c_str(), h.device, l, stream, P);
}

bool sm90_encode_backward(const kern::AttentionParams& a, int64_t D,
                          kern::Sm90BackwardParams* params) {
  const Api* api = tma_api();
  if (api == nullptr) return false;
  params->a = a;
  params->dq_accum = params->ds_rowsum = nullptr;  // sm90_fused_backward_launch sets them
  params->ds_tiles = nullptr;                      // the stored-dS backward sets them
  params->kv_unit0 = params->ds_q_tiles = params->ds_slots = 0;
  params->q_tiles = static_cast<int32_t>(blocks_for(a.Sq, 64));
  return encode(*api, a.q, a.B, a.Hq, a.Sq, D, &params->q) &&
         encode(*api, a.k, a.B, a.Hkv, a.Skv, D, &params->k) &&
         encode(*api, a.v, a.B, a.Hkv, a.Skv, D, &params->v) &&
         encode(*api, a.dout, a.B, a.Hq, a.Sq, D, &params->dout);
}

void sm90_dq_launch(const fva_handle& h, Sm90Kind kind, const kern::Sm90BackwardParams& params,
                    int64_t D, int32_t dtype, void* stream) {
  // sm90/attention_dq.cuh: one 128-thread block per 64 query rows, Q, dO, K and V tiles.
  const KernelName name("fva_sm90_", kind == Sm90Kind::kQat ? "qat" : "vsa", "_bwd_dq_", dtype_suffix(dtype), "_d", D);
  launch("sm90", name.c_str(), h.device, compact_launch(params.a, D, 4), stream, params);
}

namespace {

// Which dK/dV kernel (sm90/attention_dkdv.cuh): plain, with dQ reduced into the accumulator
// (kFuseDq: two consumers of 64 keys per block), or storing dS (kStoreDs).
enum class Dkdv { kPlain, kFusedDq, kStoresDs };

// dK/dV over the (b, kv head) units [params.kv_unit0, + kv_units): a producer warpgroup and one
// consumer per 64 keys.
void dkdv_launch(const fva_handle& h, Sm90Kind kind, const kern::Sm90BackwardParams& params,
                 int64_t D, int32_t dtype, Dkdv variant, int64_t kv_units, void* stream) {
  const bool fused = variant == Dkdv::kFusedDq;
  const int consumers = fused ? kern::kSm90DkdvFusedConsumers : kern::kSm90DkdvConsumers;
  Launch l;
  l.grid_x = blocks_for(params.a.Skv, 64 * consumers);
  l.grid_y = static_cast<unsigned>(kv_units);
  if (params.a.kv_units_first) std::swap(l.grid_x, l.grid_y);  // schedules/dkdv_grid.cuh
  l.block = static_cast<unsigned>(kern::kWarpgroupThreads * (1 + consumers));
  l.smem = static_cast<size_t>(kern::sm90_dkdv_smem_bytes(static_cast<int>(D), kDkdvStages, fused));
  const char* suffix = fused ? "q" : variant == Dkdv::kStoresDs ? "s" : "";
  const KernelName name("fva_sm90_", kind == Sm90Kind::kQat ? "qat" : "vsa", "_bwd_dkdv", suffix, "_",
                        dtype_suffix(dtype), "_d", D);
  launch("sm90", name.c_str(), h.device, l, stream, params);
}

int64_t kv_units_of(const kern::AttentionParams& a) { return static_cast<int64_t>(a.B) * a.Hkv; }

}  // namespace

void sm90_dkdv_launch(const fva_handle& h, Sm90Kind kind, const kern::Sm90BackwardParams& params,
                      int64_t D, int32_t dtype, void* stream) {
  dkdv_launch(h, kind, params, D, dtype, Dkdv::kPlain, kv_units_of(params.a), stream);
}

Sm90DsChunks sm90_ds_chunks(int64_t budget, int64_t kv_units, int64_t tiles_per_kv_unit) {
  if (kv_units <= 0 || budget == 0) return {};
  const int64_t per_unit = tiles_per_kv_unit * kern::sm90_ds_tile_bytes;
  if (per_unit == 0) return {kv_units, 0};
  if (per_unit > budget) return {};
  int64_t per_chunk = std::min(budget / per_unit, kv_units);
  const int64_t chunks = (kv_units + per_chunk - 1) / per_chunk;
  per_chunk = (kv_units + chunks - 1) / chunks;  // the same amount of work in every chunk
  return {per_chunk, static_cast<size_t>(per_chunk * per_unit)};
}

void sm90_stored_ds_backward_launch(const fva_handle& h, Sm90Kind kind,
                                    kern::Sm90BackwardParams& params, int64_t D, int32_t dtype,
                                    const Sm90DsChunks& chunks, void* ds_tiles, int32_t ds_q_tiles,
                                    int32_t ds_slots, void* stream) {
  const kern::AttentionParams& a = params.a;
  const KernelName dq("fva_sm90_", kind == Sm90Kind::kQat ? "qat" : "vsa", "_bwd_dqs_", dtype_suffix(dtype), "_d", D);
  const size_t dq_smem =
      static_cast<size_t>(kern::sm90_dq_from_ds_smem_bytes(static_cast<int>(D), kDsStages));
  params.ds_tiles = ds_tiles;
  params.ds_q_tiles = ds_q_tiles;
  params.ds_slots = ds_slots;
  const int64_t kv_units = kv_units_of(a);
  for (int64_t u0 = 0; u0 < kv_units; u0 += chunks.kv_units_per_chunk) {
    const int64_t units = std::min(chunks.kv_units_per_chunk, kv_units - u0);
    params.kv_unit0 = static_cast<int32_t>(u0);
    // dK/dV storing the chunk's dS tiles (two blocks per SM), then dQ from them for the chunk's q
    // heads (sm90/attention_dq_from_ds.cuh: kDsStages ring stages, four blocks per SM). The
    // chunks reuse the tiles' workspace in stream order.
    dkdv_launch(h, kind, params, D, dtype, Dkdv::kStoresDs, units, stream);
    // Only the first dK/dV may run beside the kernels before it (kern::BlockTerms::written_beside):
    // every later kernel reads what the one before it writes.
    params.a.terms.written_beside = 0;
    launch("sm90", dq.c_str(), h.device, query_tile_launch(a, units * (a.Hq / a.Hkv), dq_smem),
           stream, params);
  }
}

void sm90_fused_backward_reset(float* accumulator, int64_t B, int64_t Hq, int64_t Sq, int64_t D,
                               void* stream) {
  // dq_accum, then ds_rowsum; one memset zeroes both.
  memset_words(accumulator, 0,
               static_cast<size_t>(kern::sm90_dq_accumulator_bytes(B, Hq, Sq, D) / 4), stream,
               "the dQ accumulator");
}

void sm90_fused_backward_launch(const fva_handle& h, Sm90Kind kind,
                                kern::Sm90BackwardParams& params, int64_t D, int32_t dtype,
                                float* accumulator, void* stream) {
  const kern::AttentionParams& a = params.a;
  // dq_accum, then ds_rowsum (zeroed by sm90_fused_backward_reset, before the call's first kernel).
  params.dq_accum = accumulator;
  params.ds_rowsum = accumulator + kern::sm90_dq_accumulator_rows(a.B, a.Hq, a.Sq) * D;
  dkdv_launch(h, kind, params, D, dtype, Dkdv::kFusedDq, kv_units_of(a), stream);
  // sm90/dq_accumulator.cuh: a 128-thread block per 64-row query tile of every (b, q head).
  const KernelName name("fva_sm90_dq_convert_", dtype_suffix(dtype), "_d", D);
  launch("sm90", name.c_str(), h.device,
         query_tile_launch(a, static_cast<int64_t>(a.B) * a.Hq, 0), stream, params);
}

}  // namespace fva::cuda
