// Zeroing the padding rows of a shared-memory tile: a ragged VSA block's slots past its tokens hold
// the caller's data, NaN included, which a product would carry through 0 * NaN.
#pragma once

#include "primitives/sm90.cuh"

namespace fva::dev::sm90 {

// Rows [first_row, 64) of a shared-memory tile (D / 64 swizzled regions of 64 rows x 128 bytes)
// set to zero by one warpgroup (tid = its thread), then made visible to the tensor cores' (async)
// proxy and to the whole warpgroup.
template <int kRegions>
__device__ __forceinline__ void zero_tile_rows(uint32_t tile, int first_row, int tid) {
  constexpr int kRegionBytes = 64 * 128;
  for (int i = tid; i < (64 - first_row) * kRegions * 8; i += 128) {
    const int row = first_row + i / (kRegions * 8), rest = i % (kRegions * 8);
    const uint32_t addr = tile + (rest / 8) * kRegionBytes + row * 128 + (rest % 8) * 16;
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
  }
  fence_proxy_async();
  warpgroup_sync();
}

}  // namespace fva::dev::sm90
