// The plans of VSA on the CUDA backend: which kernels run a call, how the backward computes dQ and
// orders its dK/dV blocks, and the workspace layout, from the handle and the shapes alone (index
// contents are never read on the host). The workspace query and the call build the same plan;
// vsa_ops.cpp executes it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/problems.h"
#include "core/workspace.h"
#include "handle.h"
#include "qat_plan.h"  // KernelFamily
#include "shared/kernel_params.h"
#include "sm90_kernels.h"

namespace fva::cuda {

struct VsaForwardPlan {
  KernelFamily family = KernelFamily::kPortable;
  size_t workspace_bytes = 0;  // none
};
VsaForwardPlan plan_vsa_forward(const fva_handle& h, const VsaProblem& p);

// The k2q inverse's buffers (kernels/indices/vsa_invert.cu), for `units` = B * H lists.
struct VsaInverseRegions {
  kern::InvertChunking chunking;
  WorkspaceRegion tally, offsets, entries;
};

struct VsaBackwardPlan {
  KernelFamily family = KernelFamily::kPortable;
  Sm90DsChunks ds_chunks;  // kv_units_per_chunk > 0: the sm_90a backward stores dS
  // The dK/dV blocks run longest list first (fva_vsa_invert_order keeps a unit's block weights in
  // shared memory, up to kern::kVsaOrderMaxKvBlocks); Delta then runs beside the inverse's kernels
  // and the order waits for it.
  bool orders_kv_blocks = false;
  // The dK/dV launch runs its blocks rank by rank across the (b, kv head) units, every unit's
  // longest lists first (schedules/dkdv_grid.cuh), where they are ordered and the launch's Q and dO
  // fit in the L2 together; unit by unit otherwise.
  bool dkdv_units_first = false;
  WorkspaceRegion delta;
  VsaInverseRegions inverse;
  WorkspaceRegion kv_order, delta_done, ds_tiles;
  size_t workspace_bytes = 0;
};
VsaBackwardPlan plan_vsa_backward(const fva_handle& h, const VsaProblem& p);

struct VsaInvertPlan {
  VsaInverseRegions inverse;
  size_t workspace_bytes = 0;
};
VsaInvertPlan plan_vsa_invert(const VsaIndexProblem& p);

}  // namespace fva::cuda
