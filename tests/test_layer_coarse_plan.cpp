// The shared-memory plan of the VSA layer's coarse kernels (kernels/shared/layer_coarse_plan.h),
// without a GPU: the chunks at the shapes of docs/perf.md on an H100, and over many shapes on every
// class of GPU since Ampere what every plan must hold (a launch past the per-block limit fails; a
// stage that is not a whole number of 128-row steps, or a chunk that is not a whole number of k16
// steps, would read past what the kernels stage).
#include <doctest/doctest.h>

#include <cstdint>
#include <initializer_list>

#include "shared/layer_coarse_plan.h"

using fva::kern::LayerCoarseSmemPlan;
using fva::kern::layer_coarse_static_bytes;
using fva::kern::plan_layer_coarse_smem;

namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kH100PerSm = 228 * kKiB;

// The device's limit on one block's shared memory: the SM's, less the 1 KiB the driver keeps.
int64_t per_block_limit(int64_t per_sm) { return per_sm - kKiB; }

}  // namespace

TEST_CASE("the coarse kernels' chunks at docs/perf.md's layer shapes on an H100") {
  // 32 frames: 208 q and kv blocks, D = 128. Every kv block in one stage, two blocks an SM.
  const LayerCoarseSmemPlan small = plan_layer_coarse_smem(kH100PerSm, 128, 208, 208);
  CHECK(small.rows_in_smem);
  CHECK(small.stage_rows == 256);
  CHECK(small.kv_chunk_rows == 176);  // 208 q blocks take two chunks on the kv side
  CHECK(2 * (layer_coarse_static_bytes(128) + small.q_side_bytes + kKiB) <= kH100PerSm);
  CHECK(2 * (fva::kern::layer_coarse_kv_static_bytes() + small.kv_side_bytes + kKiB) <= kH100PerSm);
  // Wan2.1-14B: 624 blocks. The kv blocks take three stages of 256.
  const LayerCoarseSmemPlan wan = plan_layer_coarse_smem(kH100PerSm, 128, 624, 624);
  CHECK(wan.rows_in_smem);
  CHECK(wan.stage_rows == 256);
  CHECK(2 * (layer_coarse_static_bytes(128) + wan.q_side_bytes + kKiB) <= kH100PerSm);
  // Past 1024 kv blocks the tile rows stay in global memory.
  CHECK_FALSE(plan_layer_coarse_smem(kH100PerSm, 64, 18, 1030).rows_in_smem);
}

TEST_CASE("every coarse plan fits one block's limit and stages whole steps, on every GPU since Ampere") {
  // Shared memory per SM: sm_86 / sm_89 / sm_120 (100 KiB), sm_80 (164 KiB), sm_90 / sm_100
  // (228 KiB), and a device that does not say (0: planned as 100 KiB).
  for (int64_t per_sm : {int64_t{0}, 100 * kKiB, 164 * kKiB, 228 * kKiB}) {
    const int64_t limit = per_block_limit(per_sm > 0 ? per_sm : 100 * kKiB);
    for (int64_t D : {64, 128}) {
      for (int64_t n = 1; n <= 4200; n += (n < 300 ? 1 : 37)) {
        const LayerCoarseSmemPlan p = plan_layer_coarse_smem(per_sm, D, n, n);
        INFO("smem per SM " << per_sm << ", D " << D << ", nq = nkv = " << n);
        CHECK(p.rows_in_smem == (n <= fva::kern::kLayerCoarseSmemMaxKv));
        CHECK(p.stage_rows >= 128);
        CHECK(p.stage_rows % 128 == 0);
        CHECK(p.stage_rows <= (n + 127) / 128 * 128);  // never more than every kv block
        CHECK(layer_coarse_static_bytes(D) + p.q_side_bytes <= limit);
        CHECK(p.kv_chunk_rows >= 16);
        CHECK(p.kv_chunk_rows % 16 == 0);
        CHECK(p.kv_chunk_rows <= (n + 15) / 16 * 16);
        CHECK(fva::kern::layer_coarse_kv_static_bytes() + p.kv_side_bytes <= limit);
        if (p.stage_rows < n) {
          // Several chunks only where one would not leave room for two blocks an SM.
          const int64_t one_chunk = layer_coarse_static_bytes(D) + p.q_side_bytes +
                                    ((n + 127) / 128 * 128 - p.stage_rows) * 2 * (D + 8);
          CHECK(2 * (one_chunk + kKiB) > (per_sm > 0 ? per_sm : 100 * kKiB));
        }
      }
    }
  }
}
