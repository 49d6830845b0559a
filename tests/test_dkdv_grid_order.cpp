// The VSA backward's choice of dK/dV grid layout (kern::vsa_dkdv_units_first,
// schedules/dkdv_grid.cuh), without a GPU: rank by rank across the units only while the call's Q
// and dO fit in the L2, and docs/perf.md's shapes take the layout ARCHITECTURE.md and the CHANGELOG
// say, on the H100's L2 and on smaller ones since Ampere.
#include <doctest/doctest.h>

#include <cstdint>
#include <initializer_list>

#include "shared/kernel_params.h"

using fva::kern::kVsaOrderMaxKvBlocks;
using fva::kern::vsa_dkdv_units_first;

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kH100L2 = 50 * kMiB;  // cuDeviceGetAttribute(L2_CACHE_SIZE) on an H100 SXM
constexpr int64_t kA100L2 = 40 * kMiB;
constexpr int64_t kRtx4090L2 = 72 * kMiB;
constexpr int64_t kRtx3090L2 = 6 * kMiB;

// A sequence of S tokens in 64-token blocks.
constexpr int64_t blocks(int64_t S) { return (S + 63) / 64; }

}  // namespace

TEST_CASE("docs/perf.md's VSA shapes take the dK/dV layout the docs say on an H100") {
  // B = 1, H = 8, D = 128, S = 4096: Q and dO are 16 MiB, rank by rank.
  CHECK(vsa_dkdv_units_first(1, 8, blocks(4096), 128, blocks(4096), kH100L2));
  // S = 16384 (64 MiB), ThunderKittens' H = 12 at S = 49152, B = 2, and the VSA layer at 32 frames
  // (H = 12, 208 blocks: 78 MiB): unit by unit.
  CHECK_FALSE(vsa_dkdv_units_first(1, 8, blocks(16384), 128, blocks(16384), kH100L2));
  CHECK_FALSE(vsa_dkdv_units_first(1, 12, blocks(49152), 128, blocks(49152), kH100L2));
  CHECK_FALSE(vsa_dkdv_units_first(2, 8, blocks(16384), 128, blocks(16384), kH100L2));
  CHECK_FALSE(vsa_dkdv_units_first(1, 12, 208, 128, 208, kH100L2));
  // D = 64 halves the bytes: H = 16 at S = 4096 is 16 MiB.
  CHECK(vsa_dkdv_units_first(1, 16, blocks(4096), 64, blocks(4096), kH100L2));
}

TEST_CASE("the dK/dV grid runs rank by rank exactly while Q and dO fit in the L2") {
  for (const int64_t l2 : {kRtx3090L2, kA100L2, kH100L2, kRtx4090L2}) {
    // 2 * Hq * nqb * 64 * D * 2 bytes: at D = 128 and Hq = 1, 32 KiB per q block.
    const int64_t fitting_q_blocks = l2 / (32 * 1024);
    CHECK(vsa_dkdv_units_first(1, 1, fitting_q_blocks, 128, 64, l2));
    CHECK_FALSE(vsa_dkdv_units_first(1, 1, fitting_q_blocks + 1, 128, 64, l2));
  }
  // Unknown L2, or kv blocks the backward does not order: unit by unit.
  CHECK_FALSE(vsa_dkdv_units_first(1, 8, 64, 128, 64, 0));
  CHECK_FALSE(vsa_dkdv_units_first(1, 1, 4, 64, kVsaOrderMaxKvBlocks + 1, kH100L2));
  CHECK(vsa_dkdv_units_first(1, 1, 4, 64, kVsaOrderMaxKvBlocks, kH100L2));
}
