// The problems the API layer hands a backend: shapes and configuration resolved from the caller's
// descriptors and config structs, after every argument check. Both backends (src/cpu/, src/cuda/)
// and their planners read these; nothing here depends on a backend.
#pragma once

#include <cstdint>

#include "fvattn/fvattn.h"

namespace fva {

// NVFP4 fake quantization of a whole [B, H, S, D] tensor along D (fva_nvfp4_fake_quantize);
// scale_mode FVA_SCALE_BLOCK or FVA_SCALE_TILE, tile_tokens >= 1.
struct Nvfp4Problem {
  int32_t scale_mode = FVA_SCALE_BLOCK;
  int64_t tile_tokens = 32;
};

// QAT attention: cfg.softmax_scale already replaced by `scale`.
struct QatProblem {
  fva_qat_config_t cfg{};
  float scale = 0.0f;
  int32_t dtype = FVA_DTYPE_BF16;  // of q, k, v (and the outputs)
  int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, Skv = 0, D = 0;
};

// VSA block-sparse attention: Sq = 64 * num_q_blocks, Skv = 64 * num_kv_blocks,
// max_k = q2k_idx.shape[3].
struct VsaProblem {
  float scale = 0.0f;
  int32_t dtype = FVA_DTYPE_BF16;  // of q, k, v (and the outputs)
  int64_t B = 0, Hq = 0, Hkv = 0, num_q_blocks = 0, num_kv_blocks = 0, max_k = 0, D = 0;
};
constexpr int64_t kVsaBlock = 64;

// The whole VSA layer (SPEC section 3b): the fine branch's problem with max_k = topk (the
// effective count: at most num_kv_blocks), and whether a gate multiplies the coarse output.
struct VsaLayerProblem {
  VsaProblem fine;
  int64_t topk = 0;  // min(cfg->topk, num_kv_blocks), equal to fine.max_k
  bool gate = false;
};

// Inversion of VSA's q2k lists (H = the heads of q2k_idx).
struct VsaIndexProblem {
  int64_t B = 0, H = 0, num_q_blocks = 0, num_kv_blocks = 0, max_k = 0;
};

}  // namespace fva
