// Which (b, kv head) unit and which of its key blocks a dK/dV block takes, from its place in the
// launch grid. The GPU starts a launch's blocks in grid order (x fastest), so the layout decides
// what runs together and what runs last (AttentionParams::kv_units_first, the host's choice):
//   - units last (x: the key block's rank within its unit, y: the unit): the launch runs unit by
//     unit, and the blocks resident together read their few units' Q and dO through the L2;
//   - units first (x: the unit, y: the rank): the launch runs rank by rank across every unit.
//     Under VSA's order (VsaQueryTiles::key_block: a unit's longest inverse lists first) every
//     unit's longest lists start first and the shortest run last, so the SMs finish together even
//     when the launch is two or three waves of lists as short as 16 q blocks; unit by unit, the
//     last units' longest lists would start late and run past everything else. Each resident
//     block then reads another unit's Q and dO, which the host allows only while all of them fit
//     in the L2 (kern::vsa_dkdv_units_first).
#pragma once

#include "shared/kernel_params.h"

namespace fva::dev {

struct DkdvBlock {
  int unit;       // (b, kv head): b * Hkv + kv head
  int key_block;  // in units of the block's keys (64 per consumer)
};

// unit0: the launch's first unit (the stored-dS backward launches the units in chunks).
template <typename Schedule>
__device__ __forceinline__ DkdvBlock dkdv_block(const kern::AttentionParams& p, int unit0) {
  const bool units_first = p.kv_units_first != 0;
  const int unit = static_cast<int>(units_first ? blockIdx.x : blockIdx.y) + unit0;
  const int rank = static_cast<int>(units_first ? blockIdx.y : blockIdx.x);
  return {unit, Schedule::key_block(p, unit, rank)};
}

}  // namespace fva::dev
