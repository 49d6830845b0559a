// The plan of the sm_90a QAT forward's tail split (sm90/forward_split.cuh runs it): which
// query tiles are split over their key tiles, and into how many pieces; and which tile and piece
// each block of its grid runs. Pure arithmetic on the grid's shape, shared by the host
// (src/cuda/sm90_kernels.cpp), the kernel and a test that needs no GPU
// (tests/test_forward_split_plan.cpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "shared/host_device.h"

namespace fva::kern {

constexpr int kMaxForwardSplitPieces = 8;

struct ForwardSplitPlan {
  int64_t first = 0;  // tiles [first, tiles) are split
  int pieces = 1;     // 1: nothing is split (first == tiles)
};

// tiles: the grid's query tiles, one block each; slots: blocks resident at once (one per SM);
// key_tiles: the 64-key tiles every row sees; quantize_p: a piece but the last first takes its
// keys' maxima; forced: -1 plans, 0 or 1 splits nothing, N >= 2 splits the tail into N pieces
// (clamped to key_tiles and kMaxForwardSplitPieces).
// The tail is the tiles past the last full wave (all of them when they fill less than one; with
// `forced` and a full last wave, that wave). The plan takes the count of pieces, 2 to
// kMaxForwardSplitPieces with at least 8 key tiles a piece, that makes the last wave shortest by a
// model: waves of pieces, each 1 / pieces of a tile (1.3 / pieces with quantized P: the maxima's
// pass costs about 0.3 of a key tile's time per key tile) plus its start
// (the ring's fill, Q's load, the merge: about 6 key tiles); nothing unless that beats the
// unsplit wave (1 tile) by 2% of a tile.
inline ForwardSplitPlan plan_forward_split(int64_t tiles, int64_t slots, int64_t key_tiles,
                                           bool quantize_p, int forced) {
  ForwardSplitPlan plan;
  plan.first = tiles;
  if (tiles <= 0 || slots <= 0 || key_tiles <= 0 || forced == 0 || forced == 1) return plan;
  int64_t tail = tiles < slots ? tiles : tiles % slots;
  if (tail == 0 && forced > 1) tail = slots;
  if (tail == 0) return plan;
  int pieces = 1;
  if (forced > 1) {
    pieces = static_cast<int>(
        std::min<int64_t>(std::min(forced, kMaxForwardSplitPieces), key_tiles));
  } else {
    const double keys_pass = quantize_p ? 0.3 : 0.0;
    double best = 1.0 - 0.02;
    for (int k = 2; k <= kMaxForwardSplitPieces && key_tiles >= 8 * k; ++k) {
      const int64_t waves = (tail * k + slots - 1) / slots;
      const double span = static_cast<double>(waves) *
                          ((1.0 + keys_pass) / k + 6.0 / static_cast<double>(key_tiles));
      if (span < best) best = span, pieces = k;
    }
  }
  if (pieces < 2) return plan;
  plan.first = tiles - tail;
  plan.pieces = pieces;
  return plan;
}

// What block `block` of the QAT forward's one-dimensional grid runs. Blocks [0, split_first) run
// tiles [0, split_first) whole. The blocks after them run the split tiles' pieces: per group of
// `cluster` consecutive split tiles (1, or 2 when the grid runs in clusters of two blocks that
// share their K/V loads, sm90/attention_forward.cuh), piece 0 of each, then piece 1 of each, ...
// So the two blocks of a cluster (blocks 2i, 2i + 1: split_first is even then) always run the same
// piece, over the same key tiles, of two neighbouring tiles; and a tile's earlier pieces have lower
// block indices, which the hardware dispatches first (the split's waits rely on that). With
// cluster = 1: split tile u / pieces, piece u % pieces.
struct ForwardBlockWork {
  int tile;           // (b, q head) * q_tiles + row tile
  int piece, pieces;  // its share of the key tiles (pieces == 1: all of them)
  int split;          // the tile's index among the split ones (pieces > 1)
};
FVA_HD ForwardBlockWork forward_block_work(int block, int split_first, int split_pieces,
                                           int cluster) {
  ForwardBlockWork w;
  if (block < split_first) {
    w.tile = block;
    w.piece = w.split = 0;
    w.pieces = 1;
    return w;
  }
  const int u = block - split_first, group = split_pieces * cluster;
  const int in_group = u % group;
  w.pieces = split_pieces;
  w.piece = in_group / cluster;
  w.split = (u / group) * cluster + in_group % cluster;
  w.tile = split_first + w.split;
  return w;
}

// Whether the QAT forward may run in clusters of `cluster` blocks on a device of sm_count SMs
// where max_active_clusters of them fit at once (cuOccupancyMaxActiveClusters): only if they
// keep every SM busy (one block per SM). Clusters live within a GPC, so a device whose GPCs hold
// odd counts of usable SMs would leave SMs idle, which costs more (1/132 of the card per SM) than
// the shared loads save (under 1% of the kernel); 0 (the driver cannot say): no clusters.
inline bool forward_clusters_fill_device(int max_active_clusters, int cluster, int sm_count) {
  return max_active_clusters > 0 && max_active_clusters * cluster >= sm_count;
}

}  // namespace fva::kern
