#include "qat_prepare.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "nvfp4/nvfp4.h"
#include "parallel.h"

namespace fva::cpu::qat {

// ---- NVFP4 on fp32 buffers -----------------------------------------------------------------------

void nvfp4_quantize_token_rows(float* x, int64_t rows, int64_t D, int32_t scale_mode,
                               int32_t dtype) {
  const int64_t n = rows * D;
  Nvfp4SecondLevel second;  // block mode: enc = dec = 1
  if (scale_mode == FVA_SCALE_TILE) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i) amax = nvfp4_amax_step(amax, x[i]);
    second = nvfp4_second_level(amax);
  }
  // Rows are contiguous and D is a multiple of 16, so the groups of the flat buffer are exactly the
  // per-token groups along D.
  for (int64_t g0 = 0; g0 < n; g0 += kNvfp4GroupSize) {
    float* xs = x + g0;
    float amax = 0.0f;
    for (int i = 0; i < kNvfp4GroupSize; ++i) amax = nvfp4_amax_step(amax, xs[i]);
    const Nvfp4Group g = nvfp4_group(amax, second);
    for (int i = 0; i < kNvfp4GroupSize; ++i) xs[i] = round_to_dtype(dtype, nvfp4_fake_quant(g, xs[i]));
  }
}

void nvfp4_quantize_p_tile(const float* p, float* out, int64_t rows, int64_t cols, int32_t p_scale,
                           int32_t dtype) {
  // Only the real keys of the real rows take part in any max (SPEC: padding is no part of it).
  Nvfp4SecondLevel tile;  // block mode: enc = dec = 1
  if (p_scale == FVA_SCALE_TILE) {
    float amax = 0.0f;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) amax = nvfp4_amax_step(amax, p[r * kQatTile + c]);
    tile = nvfp4_second_level(amax);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* pr = p + r * kQatTile;
    float* orow = out + r * kQatTile;
    Nvfp4SecondLevel second = tile;
    if (p_scale == FVA_SCALE_ROW) {
      // rowmax of p itself (p >= 0), as FastVideo's two-level P quantization takes it.
      float rowmax = 0.0f;
      for (int64_t c = 0; c < cols; ++c) rowmax = std::max(rowmax, pr[c]);
      second = nvfp4_second_level(rowmax);
    }
    for (int64_t g0 = 0; g0 < kQatTile; g0 += kNvfp4GroupSize) {
      const int64_t valid = std::clamp<int64_t>(cols - g0, 0, kNvfp4GroupSize);
      float amax = 0.0f;
      for (int64_t c = g0; c < g0 + valid; ++c) amax = nvfp4_amax_step(amax, pr[c]);
      const Nvfp4Group g = nvfp4_group(amax, second);
      // The whole group is read (amax) before any of it is written, so out may alias p.
      for (int64_t c = g0; c < g0 + kNvfp4GroupSize; ++c)
        orow[c] = c < g0 + valid ? round_to_dtype(dtype, nvfp4_fake_quant(g, pr[c])) : 0.0f;
    }
  }
}

// ---- Q/K/V preprocessing ---------------------------------------------------------------------------

namespace {

size_t floats_bytes(int64_t n) {
  return workspace_round_up(static_cast<size_t>(n) * sizeof(float));
}

// The per-channel mean of k over (B, Hkv, Skv), accumulated in double and rounded to the dtype (what
// torch's bf16 k.mean(dim=(0, 1, 2)) gives up to the last bit of its fp32 accumulation). Partial sums
// per (b, h) are added in a fixed order, so the result does not depend on the thread count.
void smooth_k_mean(const QatProblem& p, const AttnView& k, float* mean, int threads) {
  const int64_t D = p.D;
  const int64_t units = p.B * p.Hkv;
  std::vector<double> partial(static_cast<size_t>(units * D), 0.0);
  parallel_for(units, threads, [&](int64_t u) {
    const int64_t b = u / p.Hkv, h = u % p.Hkv;
    double* sum = partial.data() + u * D;
    for (int64_t s = 0; s < p.Skv; ++s) {
      const uint16_t* row = k.row(b, h, s);
      for (int64_t d = 0; d < D; ++d) sum[d] += k.to_float(row[d]);
    }
  });
  const double count = static_cast<double>(p.B * p.Hkv * p.Skv);
  for (int64_t d = 0; d < D; ++d) {
    double total = 0.0;
    for (int64_t u = 0; u < units; ++u) total += partial[static_cast<size_t>(u * D + d)];
    mean[d] = round_to_dtype(k.dtype, static_cast<float>(total / count));
  }
}

// Loads tokens [s0, s0 + rows) of x(b, h) into dst (contiguous rows of D), subtracting `mean` first
// when given (kk = round(k - mean), the subtraction torch does in the tensor dtype), and
// fake-quantizes them as one tile when `quantize`.
void prepare_tile(const QatProblem& p, const AttnView& x, int64_t b, int64_t h, int64_t s0,
                  int64_t rows, const float* mean, bool quantize, float* dst) {
  const int64_t D = p.D;
  for (int64_t r = 0; r < rows; ++r) {
    float* out = dst + r * D;
    x.load_row(b, h, s0 + r, out);
    if (mean != nullptr)
      for (int64_t d = 0; d < D; ++d) out[d] = round_to_dtype(x.dtype, out[d] - mean[d]);
  }
  if (quantize) nvfp4_quantize_token_rows(dst, rows, D, p.cfg.qkv_scale, x.dtype);
}

}  // namespace

QatLayout qat_layout(const QatProblem& p) {
  QatLayout l;
  l.fq = 0;
  l.fk = l.fq + floats_bytes(p.B * p.Hq * p.Sq * p.D);
  l.fv = l.fk + floats_bytes(p.B * p.Hkv * p.Skv * p.D);
  l.k_mean = l.fv + floats_bytes(p.B * p.Hkv * p.Skv * p.D);
  l.end = l.k_mean + floats_bytes(p.D);
  return l;
}

QatTensors qat_prepare(const QatProblem& p, const AttnView& q, const AttnView& k, const AttnView& v,
                       bool quantize, char* base, int threads) {
  const QatLayout layout = qat_layout(p);
  QatTensors t;
  t.fq = reinterpret_cast<float*>(base + layout.fq);
  t.fk = reinterpret_cast<float*>(base + layout.fk);
  t.fv = reinterpret_cast<float*>(base + layout.fv);
  t.k_mean = reinterpret_cast<float*>(base + layout.k_mean);

  const bool smooth = p.cfg.smooth_k != 0;
  if (smooth) {
    smooth_k_mean(p, k, t.k_mean, threads);
  } else {
    std::fill(t.k_mean, t.k_mean + p.D, 0.0f);
  }

  // One work list over the 32-token tiles of q, then k, then v: the tile is the unit of the
  // second-level scale, and K/V are prepared once per kv head (not per q head).
  const int64_t D = p.D;
  const int64_t q_tiles = (p.Sq + kQatTile - 1) / kQatTile;
  const int64_t kv_tiles = (p.Skv + kQatTile - 1) / kQatTile;
  const int64_t q_units = p.B * p.Hq * q_tiles;
  const int64_t kv_units = p.B * p.Hkv * kv_tiles;
  parallel_for(q_units + 2 * kv_units, threads, [&](int64_t u) {
    if (u < q_units) {
      const int64_t bh = u / q_tiles, s0 = (u % q_tiles) * kQatTile;
      const int64_t rows = std::min(kQatTile, p.Sq - s0);
      prepare_tile(p, q, bh / p.Hq, bh % p.Hq, s0, rows, nullptr, quantize,
                   t.fq + (bh * p.Sq + s0) * D);
      return;
    }
    u -= q_units;
    const bool is_k = u < kv_units;
    if (!is_k) u -= kv_units;
    const int64_t bh = u / kv_tiles, s0 = (u % kv_tiles) * kQatTile;
    const int64_t rows = std::min(kQatTile, p.Skv - s0);
    float* dst = (is_k ? t.fk : t.fv) + (bh * p.Skv + s0) * D;
    prepare_tile(p, is_k ? k : v, bh / p.Hkv, bh % p.Hkv, s0, rows,
                 is_k && smooth ? t.k_mean : nullptr, quantize, dst);
  });
  return t;
}

}  // namespace fva::cpu::qat
