// Which tiles QAT attention's kernels visit (SPEC.md section 2), for the mainloops of
// portable/attention_{forward,backward}.cuh and of the sm_90a kernels (sm90/):
//   - QatKeyTiles (forward, dQ): the 64-key tiles of a 64-row query tile, from key 0; causal stops
//     after the tile holding the last row's diagonal. Keys past Skv and (causal) above the diagonal
//     get FastVideo's masked logit -1e6 (before scaling), so p is exactly 0 there.
//   - QatQueryTiles (dK/dV): the 32-row query tiles that see a 64-key tile, q heads of the GQA
//     group in order, query tiles ascending (causal: from the tile holding the block's first key).
#pragma once

#include "shared/kernel_params.h"

namespace fva::dev {

struct QatKeyTiles {
  static constexpr int kSubTile = 32;  // the CPU reference's (and FastVideo's) key tile
  static constexpr float kMaskedLogit = -1.0e6f;
  int n_tiles, skv;
  bool causal;
  int begin = 0;  // the first tile (restrict_to_piece)

  __device__ __forceinline__ QatKeyTiles(const kern::AttentionParams& p, int, int, int q0)
      : skv(p.Skv), causal(p.causal != 0) {
    n_tiles = (p.Skv + 63) / 64;
    if (causal) {
      const int last_row = min(p.Sq, q0 + 64) - 1;
      n_tiles = min(n_tiles, last_row / 64 + 1);
    }
  }
  // Piece `piece` of `pieces` (the sm_90a forward's tail split, never causal): the key tiles
  // [piece n / pieces, (piece + 1) n / pieces) of the n the rows see, in ascending order.
  __device__ __forceinline__ void restrict_to_piece(int piece, int pieces) {
    const int n = n_tiles;
    begin = piece * n / pieces;
    n_tiles = (piece + 1) * n / pieces;
  }
  __device__ __forceinline__ int first() const { return begin < n_tiles ? begin : -1; }
  __device__ __forceinline__ int next(int i) const { return i + 1 < n_tiles ? i + 1 : -1; }
  __device__ __forceinline__ int key0(int i) const { return i * 64; }
  __device__ __forceinline__ int valid_keys(int i) const { return min(64, skv - i * 64); }
  __device__ __forceinline__ bool visible(int row, int key, int slot, int n_valid) const {
    return slot < n_valid && !(causal && key > row);
  }
  // True when every key of tile i is visible to every row from first_row on (no mask to apply).
  __device__ __forceinline__ bool unmasked(int i, int first_row) const {
    return valid_keys(i) == 64 && !(causal && key0(i) + 63 > first_row);
  }
  // Tile bounds for a loop over ascending tiles (the sm_90a forward): tile i is unmasked for rows
  // from first_row on iff i < unmasked_end(first_row) (full tiles below Skv; causal:
  // 64 i + 63 <= first_row), and some row up to last_row sees a key of it iff i <
  // visible_end(last_row) (last_row >= 0; causal: tiles above the diagonal are not).
  __device__ __forceinline__ int unmasked_end(int first_row) const {
    const int full = skv / 64;
    return causal ? min(full, (first_row + 1) / 64) : full;
  }
  __device__ __forceinline__ int visible_end(int last_row) const {
    return causal ? last_row / 64 + 1 : n_tiles;
  }
  // Keys past Skv lie outside the tensor: the TMA fills them with zeros.
  static constexpr bool kPaddedBlocks = false;

  // The walk as VsaKeyTiles::Window gives it, for kernels written against either schedule (the
  // stored-dS dQ): here first() and next() are arithmetic already.
  struct Window {
    struct Tile {
      int index, n;
      __device__ __forceinline__ bool valid() const { return index >= 0; }
      __device__ __forceinline__ int key0() const { return index * 64; }
      __device__ __forceinline__ int tokens() const { return n; }
    };
    const QatKeyTiles& keys;
    int at;  // the next tile's index (-1: done)
    __device__ __forceinline__ explicit Window(const QatKeyTiles& k) : keys(k), at(k.first()) {}
    __device__ __forceinline__ Tile pop() {
      const Tile tile{at, at >= 0 ? keys.valid_keys(at) : 0};
      if (at >= 0) at = keys.next(at);
      return tile;
    }
  };
};

struct QatQueryTiles {
  static constexpr bool kMayQuantizeP = true;
  struct Cursor {
    int head = -1, row0 = 0, index = 0;
    __device__ __forceinline__ bool valid() const { return head >= 0; }
  };
  int group, first_head, first_tile, tiles_per_head, skv, k0;
  bool causal;

  __device__ __forceinline__ QatQueryTiles(const kern::AttentionParams& p, int, int hk, int k0_)
      : skv(p.Skv), k0(k0_), causal(p.causal != 0) {
    group = p.Hq / p.Hkv;
    first_head = hk * group;
    const int q_tiles = (p.Sq + 31) / 32;
    first_tile = causal ? min(k0 / 32, q_tiles) : 0;
    tiles_per_head = q_tiles - first_tile;
  }
  __device__ __forceinline__ Cursor at(int index) const {
    Cursor c;
    if (tiles_per_head <= 0 || index >= group * tiles_per_head) return c;
    c.index = index;
    c.head = first_head + index / tiles_per_head;
    c.row0 = (first_tile + index % tiles_per_head) * 32;
    return c;
  }
  // The key block of a dK/dV launch's x-th block: in order (VsaQueryTiles may reorder).
  static __device__ __forceinline__ int key_block(const kern::AttentionParams&, int, int x) {
    return x;
  }
  __device__ __forceinline__ Cursor first() const { return at(0); }
  __device__ __forceinline__ Cursor next(const Cursor& c) const { return at(c.index + 1); }
  __device__ __forceinline__ int valid_keys() const { return min(64, skv - k0); }
  __device__ __forceinline__ int output_rows() const { return valid_keys(); }
  // Where the stored-dS backward keeps the pair's tile among its query tile's: the key tile, as
  // QatKeyTiles numbers it (every pair a query tile's QatKeyTiles lists, this schedule visits).
  __device__ __forceinline__ int ds_slot(const Cursor&) const { return k0 / 64; }
  __device__ __forceinline__ bool visible(int row, int key, int slot, int n_valid) const {
    return slot < n_valid && !(causal && key > row);
  }
  // Every key of the block visible to every row of [row0, row0 + 64), all of them rows of the
  // problem (whose lse is finite: each sees key 0 at least): dK/dV skips the per-element checks.
  __device__ __forceinline__ bool tile_all_visible(int row0, int n_valid, int sq) const {
    return n_valid == 64 && row0 + 64 <= sq && !(causal && k0 + 63 > row0);
  }
};

}  // namespace fva::dev
