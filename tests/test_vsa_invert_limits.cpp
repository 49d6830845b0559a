// The k2q inverse's choice between one block per unit and the chunked kernels
// (kernels/shared/kernel_params.h, kernels/indices/vsa_invert.cu), without a GPU: every unit the
// one block takes fits its shared memory on every GPU since Ampere (a launch past the per-block
// limit fails), its place batches divide among its threads, and the shapes of docs/perf.md go the
// way its comments say.
#include <doctest/doctest.h>

#include <cstdint>
#include <initializer_list>

#include "shared/kernel_params.h"

using fva::kern::invert_in_one_block;
using fva::kern::invert_unit_smem_bytes;
using fva::kern::kInvertKvWindow;
using fva::kern::kInvertPlaceBatch;
using fva::kern::kInvertUnitMaxEntries;
using fva::kern::kInvertUnitThreads;

namespace {

// The smallest per-block shared-memory limit since Ampere: sm_86, sm_89 and sm_120 (100 KiB per
// SM, less the 1 KiB the driver keeps), and the kernel's static arrays (32 + 1 words).
constexpr int64_t kSmallestBlockLimit = 99 * 1024;
constexpr int64_t kUnitStaticBytes = 33 * 4;

}  // namespace

TEST_CASE("the one-block inverse's place batches divide among its threads") {
  CHECK(kInvertPlaceBatch % kInvertUnitThreads == 0);
  CHECK(kInvertUnitThreads % 32 == 0);
  CHECK(kInvertKvWindow < (1 << 15));  // its entries' kv blocks are kept as 16-bit integers
}

TEST_CASE("every unit the one-block inverse takes fits one block's shared memory on every GPU") {
  int64_t largest = 0;
  for (int64_t nkv = 1; nkv <= kInvertKvWindow + 1; nkv += (nkv < 70 ? 1 : 61)) {
    for (int64_t max_k = 1; max_k <= 2 * kInvertKvWindow; max_k += (max_k < 40 ? 1 : 53)) {
      for (int64_t group : {1, 2, 4, 8}) {
        const int64_t nqb = kInvertUnitMaxEntries / (group * max_k);  // the most rows it takes
        for (int64_t rows : {nqb, nqb + 1}) {
          if (rows < 1 || !invert_in_one_block(group, rows, nkv, max_k)) continue;
          INFO("group " << group << ", nqb " << rows << ", nkv " << nkv << ", max_k " << max_k);
          CHECK(nkv <= kInvertKvWindow);
          CHECK(group * rows * max_k <= kInvertUnitMaxEntries);
          const int64_t bytes = invert_unit_smem_bytes(nkv, rows, max_k);
          CHECK(bytes % 4 == 0);
          CHECK(bytes + kUnitStaticBytes <= kSmallestBlockLimit);
          if (bytes > largest) largest = bytes;
        }
      }
    }
  }
  // The limits themselves: 2048 kv blocks and 8192 entries of one q head.
  CHECK(invert_in_one_block(1, 4, kInvertKvWindow, kInvertKvWindow));
  CHECK(invert_unit_smem_bytes(kInvertKvWindow, 4, kInvertKvWindow) + kUnitStaticBytes <=
        kSmallestBlockLimit);
  CHECK(largest > 0);
}

TEST_CASE("the shapes of docs/perf.md take the inverse its comments say") {
  // VSA at 25% density, B = 1, H = 8: S = 4096 (64 blocks, 16 each) and 8192 in one block,
  // S = 16384 (256 blocks, 64 each) in chunks.
  CHECK(invert_in_one_block(1, 64, 64, 16));
  CHECK(invert_in_one_block(1, 128, 128, 32));
  CHECK_FALSE(invert_in_one_block(1, 256, 256, 64));
  // Grouped-query 8:2 at S = 4096: four q heads per kv head.
  CHECK(invert_in_one_block(4, 64, 64, 16));
  // The VSA layer at 32 frames (208 blocks, topk 26) in one block; at Wan2.1-14B's shape (624
  // blocks, topk 78) in chunks; ThunderKittens' shape (768 blocks, top-76) in chunks.
  CHECK(invert_in_one_block(1, 208, 208, 26));
  CHECK_FALSE(invert_in_one_block(1, 624, 624, 78));
  CHECK_FALSE(invert_in_one_block(1, 768, 768, 76));
  // More kv blocks than one window: chunks, however short the lists.
  CHECK_FALSE(invert_in_one_block(1, 1, kInvertKvWindow + 1, 1));
}
