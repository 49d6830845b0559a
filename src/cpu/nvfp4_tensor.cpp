// fva_nvfp4_fake_quantize on the CPU: the same token-row quantization QAT attention applies to q, k
// and v (qat_prepare.cpp), on a whole tensor.
#include <algorithm>
#include <vector>

#include "cpu_ops.h"
#include "parallel.h"
#include "qat_prepare.h"

namespace fva::cpu {

using namespace qat;  // the shared QAT pieces of qat_prepare.h

void nvfp4_fake_quantize(const Nvfp4Problem& p, const AttnView& x, const AttnView& y, int threads) {
  const int64_t B = x.shape[0], H = x.shape[1], S = x.shape[2], D = x.shape[3];
  // Work in units of one second-level tile (tile mode) or of 32 tokens (block mode, where tokens are
  // independent). A unit is read completely before any of it is written, so y may be x.
  const int64_t tile = p.scale_mode == FVA_SCALE_TILE ? p.tile_tokens : kQatTile;
  const int64_t tiles = (S + tile - 1) / tile;
  parallel_for(B * H * tiles, threads, [&](int64_t u) {
    const int64_t bh = u / tiles, s0 = (u % tiles) * tile;
    const int64_t b = bh / H, h = bh % H;
    const int64_t rows = std::min(tile, S - s0);
    std::vector<float> buf(static_cast<size_t>(rows * D));
    for (int64_t r = 0; r < rows; ++r) x.load_row(b, h, s0 + r, buf.data() + r * D);
    nvfp4_quantize_token_rows(buf.data(), rows, D, p.scale_mode, x.dtype);
    for (int64_t r = 0; r < rows; ++r) y.store_row(b, h, s0 + r, buf.data() + r * D);
  });
}

}  // namespace fva::cpu
