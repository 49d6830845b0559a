// fva_vsa_tile_plan: where FastVideo's tiling puts each token of a (T, H, W) video grid. The grid
// is cut into tiles of tile[0] x tile[1] x tile[2] tokens, tiles in (t, h, w) order; each tile's
// tokens, in (t, h, w) order, fill the first slots of its block (tile[0] * tile[1] * tile[2]
// slots), and tiles at the far edges, cut short by the grid, leave the rest of their block as
// padding. Host only: no handle, no device.
#include <cstdint>

#include "checks.h"
#include "error.h"

namespace fva {
namespace {

// Tiles along one axis of n tokens cut every `tile` tokens (the last one may be short).
int64_t tiles_along(int64_t n, int64_t tile) { return (n + tile - 1) / tile; }

// Tokens of tile i along that axis.
int64_t tile_extent(int64_t n, int64_t tile, int64_t i) {
  const int64_t rest = n - i * tile;
  return rest < tile ? rest : tile;
}

}  // namespace
}  // namespace fva

extern "C" {

fva_status_t fva_vsa_tile_plan(const int64_t dims[3], const int32_t tile[3], int64_t* slot_of_token,
                               int32_t* block_sizes, int64_t* num_blocks) {
  return fva::guard([&] {
    using namespace fva;
    check_not_null(dims, "dims");
    check_not_null(tile, "tile");
    const char* axis[3] = {"T", "H", "W"};
    int64_t tokens = 1;
    for (int i = 0; i < 3; ++i) {
      if (dims[i] < 1)
        fail(FVA_ERR_INVALID_ARGUMENT, "dims[{}] ({}) is {} but must be >= 1", i, axis[i], dims[i]);
      if (__builtin_mul_overflow(tokens, dims[i], &tokens) || tokens > kMaxElements)
        fail(FVA_ERR_INVALID_ARGUMENT, "dims: a {} x {} x {} grid has more than 2^56 tokens",
             dims[0], dims[1], dims[2]);
    }
    int64_t slots_per_block = 1;
    for (int i = 0; i < 3; ++i) {
      if (tile[i] < 1)
        fail(FVA_ERR_INVALID_ARGUMENT, "tile[{}] is {} but must be >= 1", i, tile[i]);
      slots_per_block *= tile[i];  // three int32 factors: no int64 overflow
      if (slots_per_block > INT32_MAX)
        fail(FVA_ERR_INVALID_ARGUMENT,
             "tile: a {} x {} x {} tile has more than 2^31 - 1 tokens (block_sizes are int32)",
             tile[0], tile[1], tile[2]);
    }
    const int64_t T = dims[0], H = dims[1], W = dims[2];
    const int64_t tt = tile[0], th = tile[1], tw = tile[2];
    const int64_t nt = tiles_along(T, tt), nh = tiles_along(H, th), nw = tiles_along(W, tw);
    // At most T * H * W <= 2^56 blocks; their slots must have 64-bit indices too.
    const int64_t blocks = nt * nh * nw;
    if (slots_per_block > 1 && blocks > (int64_t{1} << 62) / slots_per_block)
      fail(FVA_ERR_INVALID_ARGUMENT,
           "dims, tile: {} blocks of {} slots do not fit 64-bit slot indices", blocks,
           slots_per_block);

    if (block_sizes != nullptr) {
      for (int64_t it = 0; it < nt; ++it)
        for (int64_t ih = 0; ih < nh; ++ih)
          for (int64_t iw = 0; iw < nw; ++iw)
            block_sizes[(it * nh + ih) * nw + iw] = static_cast<int32_t>(
                tile_extent(T, tt, it) * tile_extent(H, th, ih) * tile_extent(W, tw, iw));
    }
    if (slot_of_token != nullptr) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t it = t / tt;
        for (int64_t h = 0; h < H; ++h) {
          const int64_t ih = h / th, eh = tile_extent(H, th, ih);
          for (int64_t w = 0; w < W; ++w) {
            const int64_t iw = w / tw, ew = tile_extent(W, tw, iw);
            const int64_t block = (it * nh + ih) * nw + iw;
            // (t, h, w) order inside the tile, whose extents may be cut short at the edges
            const int64_t local = ((t - it * tt) * eh + (h - ih * th)) * ew + (w - iw * tw);
            slot_of_token[(t * H + h) * W + w] = block * slots_per_block + local;
          }
        }
      }
    }
    if (num_blocks != nullptr) *num_blocks = blocks;
  });
}

}  // extern "C"
