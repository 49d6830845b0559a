#include "qat_plan.h"

#include "params.h"
#include "shared/key_order.h"

namespace fva::cuda {
namespace {

QatPreparation preparation(const QatProblem& p, bool quantize, bool forward) {
  QatPreparation r;
  r.quantize = quantize;
  r.mean = p.cfg.smooth_k != 0;
  r.q = r.v = quantize;
  r.k = quantize || r.mean;
  r.padded_kv = forward && quantize;
  return r;
}

// The prepared copies come first in every QAT workspace: q, k, v, then the mean.
QatPreparedRegions add_prepared(const QatProblem& p, const QatPreparation& prep,
                                WorkspaceLayout& layout) {
  QatPreparedRegions r;
  if (prep.q) r.fq = layout.add<uint16_t>(static_cast<size_t>(p.B * p.Hq * p.Sq * p.D));
  const int64_t kv = prepared_kv_rows(p, prep);
  if (prep.k) r.fk = layout.add<uint16_t>(static_cast<size_t>(p.B * p.Hkv * kv * p.D));
  if (prep.v) r.fv = layout.add<uint16_t>(static_cast<size_t>(p.B * p.Hkv * kv * p.D));
  if (prep.mean) {
    r.k_mean = layout.add<float>(static_cast<size_t>(p.D));
    r.mean_partial = layout.add<double>(static_cast<size_t>(mean_chunks(p) * p.D));
  }
  return r;
}

int64_t tiles_of(int64_t n) { return (n + 63) / 64; }

}  // namespace

int64_t prepared_kv_rows(const QatProblem& p, const QatPreparation& prep) {
  return prep.padded_kv ? owned_padded_rows(p.Skv) : p.Skv;
}

int64_t mean_chunks(const QatProblem& p) {
  return p.B * p.Hkv * ((p.Skv + kMeanChunkTokens - 1) / kMeanChunkTokens);
}

QatForwardPlan plan_qat_forward(const fva_handle& h, const QatProblem& p) {
  QatForwardPlan plan;
  const bool quantize = p.cfg.quantize != 0;
  plan.prep = preparation(p, quantize, /*forward=*/true);
  plan.portable_variant = !quantize ? "q0" : p.cfg.p_scale == FVA_SCALE_BLOCK ? "q1b" : "q1";
  if (sm90_available(h, p.D) && sm90_covers_p_scale(quantize, p.cfg.p_scale)) {
    plan.family = KernelFamily::kSm90;
    plan.split = sm90_plan_forward_split(h, p.B, p.Hq, p.Sq, p.Skv, p.D, p.cfg.causal != 0, quantize);
    plan.clusters_allowed = sm90_forward_clusters_allowed(h, plan.split, p.Sq, p.cfg.causal != 0);
  }
  WorkspaceLayout layout;
  plan.prepared = add_prepared(p, plan.prep, layout);
  if (plan.split.pieces > 1) {
    plan.split_partials = layout.add<float>(plan.split.partial_floats());
    plan.split_flags = layout.add<uint32_t>(2 * plan.split.flag_words());
    if (plan.split.quantize_p) plan.split_maxima = layout.add<float>(plan.split.maxima_floats());
  }
  plan.workspace_bytes = layout.bytes();
  return plan;
}

QatBackwardPlan plan_qat_backward(const fva_handle& h, const QatProblem& p) {
  QatBackwardPlan plan;
  // FastVideo's use_qat_qkv_backward = 0 runs the backward on the unquantized (smoothed) inputs;
  // quantize_p_backward = 0 gives dV the unquantized P.
  const bool quantize = p.cfg.quantize != 0 && p.cfg.quantized_qkv_backward != 0;
  plan.quantize_p = p.cfg.quantize != 0 && p.cfg.quantize_p_backward != 0;
  plan.prep = preparation(p, quantize, /*forward=*/false);
  if (sm90_available(h, p.D)) {
    plan.family = KernelFamily::kSm90;
    plan.sm90_dkdv = sm90_covers_p_scale(plan.quantize_p, p.cfg.p_scale);
  }
  if (plan.sm90_dkdv) {
    // Stored dS within the budget: a tile per q head, query tile and key tile (causal: the pairs
    // above the diagonal stay unused). Beyond it, a handle that is not deterministic fuses dQ
    // into dK/dV at D = 128.
    plan.ds_chunks = sm90_ds_chunks(h.tuning.ds_budget_bytes(), p.B * p.Hkv,
                                    (p.Hq / p.Hkv) * tiles_of(p.Sq) * tiles_of(p.Skv));
    if (plan.ds_chunks.kv_units_per_chunk > 0)
      plan.dq = DqMode::kStoredDs;
    else if (p.D == 128 && !h.deterministic)
      plan.dq = DqMode::kFusedAccumulator;
  }
  WorkspaceLayout layout;
  plan.prepared = add_prepared(p, plan.prep, layout);
  plan.delta = layout.add<float>(static_cast<size_t>(p.B * p.Hq * p.Sq));
  if (plan.dq == DqMode::kFusedAccumulator)
    plan.dq_accumulator = layout.add<float>(
        static_cast<size_t>(kern::sm90_dq_accumulator_bytes(p.B, p.Hq, p.Sq, p.D) / 4));
  if (plan.dq == DqMode::kStoredDs) plan.ds_tiles = layout.add<char>(plan.ds_chunks.bytes);
  plan.workspace_bytes = layout.bytes();
  return plan;
}

}  // namespace fva::cuda
