// Which tiles VSA's kernels visit (SPEC.md section 3), for the mainloops of
// portable/attention_{forward,backward}.cuh and of the sm_90a kernels (sm90/). The caller's
// metadata is read under the rules every backend applies (src/cpu/vsa_common.h): q2k_num clamped
// to [0, max_k], entries outside [0, num_kv_blocks) skipped, block sizes clamped to [0, 64], blocks
// without a real token skipped.
//   - VsaKeyTiles (forward, dQ): a q block's listed kv blocks in list order; keys at slots past
//     the block's size are masked to -inf.
//   - VsaQueryTiles (dK/dV): for a kv block, the q blocks of the inverse lists built in the
//     workspace (ascending), each as two 32-row tiles, q heads of the GQA group in order, with the
//     q2k slot that listed the pair (the sm_90 backward stores the pair's dS tile by it).
#pragma once

#include <math_constants.h>

#include "primitives/sm80.cuh"
#include "shared/kernel_params.h"

namespace fva::dev {

__device__ __forceinline__ int vsa_block_tokens(const kern::VsaLists& v, int kv) {
  return min(max(v.block_sizes[kv * v.block_sizes_stride], 0), 64);
}

struct VsaKeyTiles {
  static constexpr int kSubTile = 64;
  static constexpr float kMaskedLogit = -__builtin_huge_valf();
  const kern::VsaLists& v;
  const int32_t* list;
  int count;

  __device__ __forceinline__ VsaKeyTiles(const kern::AttentionParams& p, int b, int h, int q0)
      : v(p.vsa) {
    const int qb = q0 / 64;
    list = v.q2k_idx + b * v.idx_stride_b + h * v.idx_stride_h + qb * v.idx_stride_qb;
    const int n = v.q2k_num[b * v.num_stride_b + h * v.num_stride_h + qb * v.num_stride_qb];
    count = min(max(n, 0), v.max_k);
  }
  __device__ __forceinline__ bool usable(int i) const {
    const int kv = list[i];
    return kv >= 0 && kv < v.num_kv_blocks && vsa_block_tokens(v, kv) > 0;
  }
  __device__ __forceinline__ int scan(int i) const {
    for (; i < count; ++i)
      if (usable(i)) return i;
    return -1;
  }
  __device__ __forceinline__ int first() const { return scan(0); }
  __device__ __forceinline__ int next(int i) const { return scan(i + 1); }
  __device__ __forceinline__ int key0(int i) const { return list[i] * 64; }
  __device__ __forceinline__ int valid_keys(int i) const { return vsa_block_tokens(v, list[i]); }
  __device__ __forceinline__ bool visible(int, int, int slot, int n_valid) const {
    return slot < n_valid;
  }
  __device__ __forceinline__ bool unmasked(int i, int) const { return valid_keys(i) == 64; }
  // A block's slots past its size are padding inside the tensor, loaded with the rest.
  static constexpr bool kPaddedBlocks = true;

  // The same walk for a kernel whose warps each step through the list together (every lane
  // converged: the compact sm_90a forward). A warp reads the list 32 entries at a time, lane j
  // entry base + j with its block's size, and keeps a bit per usable entry: the next tile is then
  // a find-first-set and one shuffle of registers, where next() scans with two dependent global
  // loads per entry (the entry, then its block's size) and key0() and valid_keys() load them
  // again. Every warp of a block runs its own window over the same data, so all agree on every
  // tile without a barrier. The tiles and their order are next()'s.
  struct Window {
    // A visited kv block, packed: kv << 7 | tokens (tokens in [1, 64]); 0: the list is done.
    // index: its place in the list (the stored-dS backward keeps the pair's dS tile by it).
    struct Tile {
      uint32_t code;
      int index;
      __device__ __forceinline__ bool valid() const { return code != 0u; }
      __device__ __forceinline__ int key0() const { return static_cast<int>(code >> 7) * 64; }
      __device__ __forceinline__ int tokens() const { return static_cast<int>(code & 127u); }
    };
    const VsaKeyTiles& keys;
    int base;         // the list index of lane 0's entry
    uint32_t packed;  // this lane's entry (base + lane) as a Tile code, 0 if unusable
    uint32_t usable;  // bit j: entry base + j is usable and not yet taken

    __device__ __forceinline__ explicit Window(const VsaKeyTiles& k) : keys(k) { read(0); }
    __device__ __forceinline__ void read(int from) {
      base = from;
      const int i = from + static_cast<int>(threadIdx.x & 31);
      uint32_t code = 0u;
      // The entry is read below max_k (the tensor's row), not below the count, so that its load
      // need not wait for the count's: at a block's start the two run together, then the block
      // size's, two round trips to the L2 before the first K can be loaded instead of three.
      const int kv = i < keys.v.max_k ? keys.list[i] : -1;
      // kv < num_kv_blocks <= Skv / 64 < 2^25, so kv << 7 fits.
      if (i < keys.count && kv >= 0 && kv < keys.v.num_kv_blocks) {
        code = static_cast<uint32_t>(kv) << 7 | static_cast<uint32_t>(vsa_block_tokens(keys.v, kv));
        if ((code & 127u) == 0u) code = 0u;  // a block without a real token
      }
      packed = code;
      usable = __ballot_sync(0xffffffffu, code != 0u);
      // The next window's entries into the L1 now, for its read 32 tiles later in pop() (two
      // dependent loads: the entry, then its block's size, each an L2 round trip otherwise). The
      // prefetch shortens that read only in part: the sizes, or the entries, still come from the
      // L2. The kernels pop while a product runs, which hides most of the rest.
      if (i + 32 < keys.count) prefetch_l1(keys.list + i + 32);
    }
    // The next tile of the list (invalid once it is done).
    __device__ __forceinline__ Tile pop() {
      while (usable == 0u && base + 32 < keys.count) read(base + 32);
      if (usable == 0u) return Tile{0u, -1};
      const int j = __ffs(usable) - 1;
      usable &= usable - 1u;
      return Tile{__shfl_sync(0xffffffffu, packed, j), base + j};
    }
  };
};

struct VsaQueryTiles {
  static constexpr bool kMayQuantizeP = false;
  struct Cursor {
    int head = -1, row0 = 0, entry = 0, half = 0;
    int slot = 0;  // the entry's place in its q block's q2k list
    __device__ __forceinline__ bool valid() const { return head >= 0; }
  };
  const kern::VsaLists& v;
  int b, kv, group, first_head, tokens, hq_total;

  __device__ __forceinline__ VsaQueryTiles(const kern::AttentionParams& p, int b_, int hk, int k0)
      : v(p.vsa), b(b_), kv(k0 / 64), hq_total(p.Hq) {
    group = p.Hq / p.Hkv;
    first_head = hk * group;
    tokens = vsa_block_tokens(v, kv);
  }
  // Entries [begin, end) of kv's inverse list for q head `head`.
  __device__ __forceinline__ void range(int head, int& begin, int& end) const {
    const int64_t u = static_cast<int64_t>(b) * hq_total + head;
    const int32_t* off = v.inv_offsets + u * (v.num_kv_blocks + 1);
    begin = off[kv];
    end = off[kv + 1];
  }
  // Finds the first tile at or after (head, entry, half).
  __device__ __forceinline__ Cursor seek(int head, int entry, int half) const {
    Cursor c;
    for (; head < first_head + group; ++head, entry = -1, half = 0) {
      int begin, end;
      range(head, begin, end);
      if (entry < begin) entry = begin;
      if (entry < end) {
        const int64_t u = static_cast<int64_t>(b) * hq_total + head;
        c.head = head;
        c.entry = entry;
        c.half = half;
        const int32_t code = v.inv_entries[u * v.inv_entries_per_unit + entry];
        c.slot = code & ((1 << v.slot_bits) - 1);
        c.row0 = (code >> v.slot_bits) * 64 + 32 * half;
        return c;
      }
    }
    return c;
  }
  // The kv block the x-th block of a dK/dV launch over unit (b, kv head) `unit` takes: the
  // inverse's order (longest lists first) where the host built it.
  static __device__ __forceinline__ int key_block(const kern::AttentionParams& p, int unit, int x) {
    return p.vsa.kv_order != nullptr
               ? p.vsa.kv_order[static_cast<int64_t>(unit) * p.vsa.num_kv_blocks + x]
               : x;
  }
  __device__ __forceinline__ Cursor first() const { return seek(first_head, -1, 0); }
  __device__ __forceinline__ Cursor next(const Cursor& c) const {
    return c.half == 0 ? seek(c.head, c.entry, 1) : seek(c.head, c.entry + 1, 0);
  }
  __device__ __forceinline__ int valid_keys() const { return tokens; }
  __device__ __forceinline__ int output_rows() const { return 64; }
  // Where the stored-dS backward keeps the pair's tile among its q block's: the q2k slot.
  __device__ __forceinline__ int ds_slot(const Cursor& c) const { return c.slot; }
  __device__ __forceinline__ bool visible(int, int, int slot, int n_valid) const {
    return slot < n_valid;
  }
  // Every key of the block visible to every row of [row0, row0 + 64), all of them rows of the
  // problem: the q block lists this kv block (its inverse list holds it), whose 64 keys are all
  // real, so every row's lse is finite. dK/dV skips the per-element checks.
  __device__ __forceinline__ bool tile_all_visible(int row0, int n_valid, int sq) const {
    return n_valid == 64 && row0 + 64 <= sq;
  }
};

}  // namespace fva::dev
