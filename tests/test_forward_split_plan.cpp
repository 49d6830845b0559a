// The plan of the sm_90a QAT forward's tail split (kernels/shared/forward_split_plan.h), without a
// GPU: the benchmark's shapes on the H200 (132 SMs, B = 1, H = 8: 1024 query tiles of 128 rows at
// S = 16384, 2048 at 32768), the forced counts, and over many shapes what every plan must hold
// (the kernel hangs on an empty piece: a piece needs at least one key tile).
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "shared/forward_split_plan.h"

using fva::kern::ForwardSplitPlan;
using fva::kern::kMaxForwardSplitPieces;
using fva::kern::plan_forward_split;

TEST_CASE("the QAT forward's tail split plan at the benchmark's shapes on the H200") {
  // S = 16384: 100 tiles in the last wave. Quantized P's maxima pass makes any split longer than
  // the unsplit wave; plain attention takes 5 pieces (500 in 4 waves of a fifth of a tile).
  CHECK(plan_forward_split(1024, 132, 256, true, -1).pieces == 1);
  const ForwardSplitPlan plain16 = plan_forward_split(1024, 132, 256, false, -1);
  CHECK(plain16.pieces == 5);
  CHECK(plain16.first == 924);
  // S = 32768: 68 tiles in the last wave, 7 pieces either way.
  const ForwardSplitPlan q32 = plan_forward_split(2048, 132, 512, true, -1);
  CHECK(q32.pieces == 7);
  CHECK(q32.first == 1980);
  CHECK(plan_forward_split(2048, 132, 512, false, -1).pieces == 7);
}

TEST_CASE("the tail split plan: full waves, few keys, less than a wave, forced counts") {
  CHECK(plan_forward_split(264, 132, 512, true, -1).pieces == 1);  // a full last wave
  CHECK(plan_forward_split(100, 132, 15, false, -1).pieces == 1);  // < 16 key tiles: 8 per piece
  const ForwardSplitPlan small = plan_forward_split(16, 132, 16, false, -1);  // every tile
  CHECK(small.pieces == 2);
  CHECK(small.first == 0);
  // Forced: clamped to the key tiles and to kMaxForwardSplitPieces; a full last wave splits.
  CHECK(plan_forward_split(16, 132, 5, true, 8).pieces == 5);
  CHECK(plan_forward_split(16, 132, 500, true, 100).pieces == kMaxForwardSplitPieces);
  const ForwardSplitPlan full = plan_forward_split(264, 132, 100, true, 3);
  CHECK(full.pieces == 3);
  CHECK(full.first == 132);
  for (int off : {0, 1}) {
    const ForwardSplitPlan none = plan_forward_split(1000, 132, 100, true, off);
    CHECK(none.pieces == 1);
    CHECK(none.first == 1000);
  }
  CHECK(plan_forward_split(0, 132, 100, true, 3).pieces == 1);
  CHECK(plan_forward_split(10, 0, 100, true, 3).pieces == 1);
}

TEST_CASE("every tail split plan keeps its pieces non-empty and within the last wave") {
  int64_t splits = 0;
  for (int64_t slots : {66, 114, 132})
    for (int64_t tiles = 1; tiles <= 700; tiles += 3)
      for (int64_t keys = 1; keys <= 600; keys += 7)
        for (bool q : {false, true})
          for (int forced : {-1, 2, 3, 8}) {
            const ForwardSplitPlan p = plan_forward_split(tiles, slots, keys, q, forced);
            CAPTURE(slots);
            CAPTURE(tiles);
            CAPTURE(keys);
            CAPTURE(forced);
            REQUIRE(p.pieces >= 1);
            REQUIRE(p.pieces <= kMaxForwardSplitPieces);
            if (p.pieces == 1) {
              REQUIRE(p.first == tiles);
              continue;
            }
            ++splits;
            REQUIRE(p.pieces <= keys);               // no empty piece
            REQUIRE(p.first >= 0);
            REQUIRE(p.first < tiles);
            REQUIRE(tiles - p.first <= slots);       // at most one wave split
            if (forced < 0) REQUIRE(keys >= 8 * p.pieces);
          }
  CHECK(splits > 0);
}

// Which tile and piece each block runs (forward_block_work), alone and in clusters of two: every
// (tile, piece) exactly once; a tile's pieces at rising block indices (a later piece waits for
// the earlier ones, which the hardware must have dispatched first); in clusters, the two blocks
// of a cluster on the same piece of neighbouring tiles (their key tiles are the same, so they
// share the loads) and in one (b, q head) when the heads' query tiles are even in count.
TEST_CASE("the QAT forward's blocks: tiles and pieces, alone and in clusters of two") {
  using fva::kern::forward_block_work;
  using fva::kern::ForwardBlockWork;
  // Alone: the split tiles' pieces are adjacent blocks (split u / pieces, piece u % pieces).
  const ForwardBlockWork a = forward_block_work(10 + 7, 10, 3, 1);
  CHECK(a.tile == 12);
  CHECK(a.split == 2);
  CHECK(a.piece == 1);
  CHECK(a.pieces == 3);
  // Pairs: piece 0 of split tiles 0 and 1, then piece 1 of both, ...
  const int expect[6][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}, {1, 2}};
  for (int u = 0; u < 6; ++u) {
    const ForwardBlockWork w = forward_block_work(4 + u, 4, 3, 2);
    CHECK(w.split == expect[u][0]);
    CHECK(w.piece == expect[u][1]);
    CHECK(w.tile == 4 + w.split);
  }
  int64_t checked = 0;
  for (int cluster : {1, 2})
    for (int q_tiles : {2, 4, 6, 128})
      for (int heads : {1, 3, 8})
        for (int pieces = 1; pieces <= kMaxForwardSplitPieces; ++pieces)
          for (int tail : {0, 2, 6, 24, 68}) {
            const int tiles = q_tiles * heads;
            if (tail > tiles || (pieces == 1 && tail != 0)) continue;
            const int first = tiles - tail, blocks = first + tail * pieces;
            CAPTURE(cluster);
            CAPTURE(q_tiles);
            CAPTURE(heads);
            CAPTURE(pieces);
            CAPTURE(tail);
            std::vector<int> seen(static_cast<size_t>(tiles) * pieces, -1);
            for (int block = 0; block < blocks; ++block) {
              const ForwardBlockWork w = forward_block_work(block, first, pieces, cluster);
              REQUIRE(w.tile >= 0);
              REQUIRE(w.tile < tiles);
              REQUIRE(w.piece >= 0);
              REQUIRE(w.piece < w.pieces);
              REQUIRE(w.pieces == (block < first ? 1 : pieces));
              if (block >= first) REQUIRE(w.split == w.tile - first);
              int& slot = seen[static_cast<size_t>(w.tile) * pieces + w.piece];
              REQUIRE(slot == -1);  // once
              slot = block;
              if (w.piece > 0) {  // the previous piece already seen, at a lower index
                REQUIRE(seen[static_cast<size_t>(w.tile) * pieces + w.piece - 1] >= 0);
              }
              if (cluster == 2 && block % 2 == 1) {
                const ForwardBlockWork partner = forward_block_work(block - 1, first, pieces, 2);
                REQUIRE(partner.piece == w.piece);
                REQUIRE(partner.pieces == w.pieces);
                REQUIRE(partner.tile + 1 == w.tile);
                REQUIRE(partner.tile / q_tiles == w.tile / q_tiles);  // one (b, q head)
              }
              ++checked;
            }
            for (int t = 0; t < tiles; ++t)
              for (int j = 0; j < (t < first ? 1 : pieces); ++j)
                REQUIRE(seen[static_cast<size_t>(t) * pieces + j] >= 0);  // every piece run
          }
  CHECK(checked > 0);
}

TEST_CASE("the QAT forward clusters only where the clusters fill every SM") {
  using fva::kern::forward_clusters_fill_device;
  CHECK(forward_clusters_fill_device(66, 2, 132));   // the H200: 66 pairs on 132 SMs
  CHECK_FALSE(forward_clusters_fill_device(65, 2, 132));  // one GPC with an odd count: 2 SMs idle
  CHECK_FALSE(forward_clusters_fill_device(56, 2, 114));
  CHECK(forward_clusters_fill_device(57, 2, 114));
  CHECK_FALSE(forward_clusters_fill_device(0, 2, 132));  // the driver cannot say
}
