// What the CPU QAT forward and backward (and fva_nvfp4_fake_quantize) share (SPEC.md sections 1, 2):
//   - NVFP4 fake quantization of token rows (Q, K, V: groups of 16 along D) and of 32x32 P tiles
//     (groups of 16 along the key axis), on fp32 buffers, built on kernels/nvfp4/nvfp4.h;
//   - the preprocessing of q, k, v into fp32 workspace buffers (smooth_k mean, fake quantization);
//   - the small fp32 vector kernels of the tile loops.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu_ops.h"
#include "views.h"
#include "core/workspace.h"

// Everything here lives in fva::cpu::qat, apart from the other CPU operations' helpers.
namespace fva::cpu::qat {

// FastVideo's legacy BLOCK_M = BLOCK_N: query and key tiles of 32, starting at 0 in each (b, h).
// The second-level (tile) scale of Q/K/V also covers 32 tokens.
constexpr int64_t kQatTile = 32;

// ---- NVFP4 on fp32 buffers -----------------------------------------------------------------------

// Fake-quantizes, in place, `rows` token rows of `D` contiguous floats (row stride D, D % 16 == 0):
// groups of 16 along each row; FVA_SCALE_TILE gives all the rows one second-level scale (the caller
// passes exactly the valid tokens of one tile), FVA_SCALE_BLOCK none. Results are rounded to dtype.
void nvfp4_quantize_token_rows(float* x, int64_t rows, int64_t D, int32_t scale_mode,
                               int32_t dtype);

// Fake-quantizes a P tile: `p` holds `rows` rows of kQatTile floats (row stride kQatTile), of which
// the first `cols` are real keys; groups of 16 keys from the tile's first key. p_scale is
// FVA_SCALE_BLOCK, FVA_SCALE_TILE (amax over the whole tile) or FVA_SCALE_ROW (rowmax per row).
// Writes round_to_dtype(FQ_P(p)) to `out` (same layout; keys past `cols` get 0). out may be p.
void nvfp4_quantize_p_tile(const float* p, float* out, int64_t rows, int64_t cols, int32_t p_scale,
                           int32_t dtype);

// ---- Q/K/V preprocessing ---------------------------------------------------------------------------

// The fp32 tensors attention runs on, in the workspace, each contiguous [B, H, S, D]:
//   fq from q; fk from kk = smooth_k ? round(k - mean) : k; fv from v; each fake-quantized when
//   `quantize` (per kv head, once), else the exact values. k_mean [D] is the dtype-rounded mean
//   (zeros without smooth_k).
struct QatTensors {
  float* fq = nullptr;
  float* fk = nullptr;
  float* fv = nullptr;
  float* k_mean = nullptr;
};

// Where the buffers lie in the workspace: byte offsets from its 64-byte aligned base, each a multiple
// of 64. `end` is where a caller may put more (e.g. the backward's Delta).
struct QatLayout {
  size_t fq = 0, fk = 0, fv = 0, k_mean = 0, end = 0;
};
QatLayout qat_layout(const QatProblem& p);


// Fills the buffers of qat_layout(p) at `base` (from workspace_base) and returns pointers to them.
QatTensors qat_prepare(const QatProblem& p, const AttnView& q, const AttnView& k, const AttnView& v,
                       bool quantize, char* base, int threads);

// ---- fp32 vector kernels ----------------------------------------------------------------------------

// Dot product with eight independent partial sums: vectorizes without -ffast-math, and the order of
// additions is fixed, so results do not depend on anything but the inputs.
inline float dot(const float* a, const float* b, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] += a[i + l] * b[i + l];
  for (; i < n; ++i) lane[i & 7] += a[i] * b[i];
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

// y += a * x.
inline void axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// y *= a.
inline void scale_in_place(float* y, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

}  // namespace fva::cpu::qat
