// The plans of QAT attention on the CUDA backend: everything a call decides before it launches
// anything (which kernels, the tail split, clusters, how dQ is computed, the workspace layout),
// from the handle, the config and the shapes alone. The workspace query and the call build the
// same plan, so the size the query reports is the layout the call uses; qat_ops.cpp executes it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/problems.h"
#include "core/workspace.h"
#include "handle.h"
#include "sm90_kernels.h"

namespace fva::cuda {

// Which attention kernels run a call: the Hopper-native ones (kernels/sm90/), which then still
// need the driver to accept the tensors' TMA maps (sm90_encode_*: a stride the TMA cannot address
// falls back to the portable kernels, for which the planned workspace also suffices), or the
// portable ones (kernels/portable/).
enum class KernelFamily { kPortable, kSm90 };

// Which inputs a call replaces by prepared copies in its workspace (NVFP4 fake quantization,
// smooth_k's mean subtraction). padded_kv: the copies of K and V hold whole 64-key tiles per
// (b, head) (the forward's quantized K and V, which the sm_90a forward reads in its own key
// order, shared/key_order.h).
struct QatPreparation {
  bool q = false, k = false, v = false, mean = false, padded_kv = false;
  bool quantize = false;  // the copies are quantized (else K is only mean-subtracted)
};

// The prepared copies' regions: fq, fk, fv [B, H, rows, D], the k mean [D] and its partial sums.
struct QatPreparedRegions {
  WorkspaceRegion fq, fk, fv, k_mean, mean_partial;
};

struct QatForwardPlan {
  KernelFamily family = KernelFamily::kPortable;
  QatPreparation prep;
  // The portable forward's variant: q0 plain attention, q1 quantized P (scale mode at run time),
  // q1b quantized P in block scales (the production preset's leaner kernel).
  const char* portable_variant = "q0";
  Sm90ForwardSplit split;         // the sm_90a forward's tail split (pieces 1: none)
  bool clusters_allowed = false;  // the sm_90a forward may run in clusters of two
  QatPreparedRegions prepared;
  WorkspaceRegion split_partials, split_flags, split_maxima;
  size_t workspace_bytes = 0;
};
QatForwardPlan plan_qat_forward(const fva_handle& h, const QatProblem& p);

// How the backward computes dQ (the sm_90a kernels; the portable backward always recomputes).
enum class DqMode {
  kRecompute,         // a dQ kernel that recomputes S and dP
  kStoredDs,          // dK/dV stores dS tiles in the workspace, a dQ kernel sums dS K from them
  kFusedAccumulator,  // dK/dV reduces dQ into an fp32 accumulator (not bitwise reproducible)
};

struct QatBackwardPlan {
  KernelFamily family = KernelFamily::kPortable;
  QatPreparation prep;
  bool quantize_p = false;  // dV from FQ_P(P)
  bool sm90_dkdv = false;   // family kSm90 and the native dK/dV covers P's scale mode
  DqMode dq = DqMode::kRecompute;
  Sm90DsChunks ds_chunks;   // dq == kStoredDs
  QatPreparedRegions prepared;
  WorkspaceRegion delta, dq_accumulator, ds_tiles;
  size_t workspace_bytes = 0;
};
QatBackwardPlan plan_qat_backward(const fva_handle& h, const QatProblem& p);

// The rows per (b, kv head) of the prepared K and V copies.
int64_t prepared_kv_rows(const QatProblem& p, const QatPreparation& prep);
// Partial sums of the k mean: B * Hkv * ceil(Skv / kMeanChunkTokens) chunks.
constexpr int kMeanChunkTokens = 256;
int64_t mean_chunks(const QatProblem& p);

}  // namespace fva::cuda
