// The record the VSA layer's forward leaves at the start of its reserve (kern::LayerReserveHeader,
// kernels/shared/vsa_layer_params.h), built from a problem: the CPU backend writes and checks it on
// the host, the CUDA backend's kernels write and check it on the device. One builder, so both
// backends recognize the same problem the same way.
#pragma once

#include <cstring>

#include "core/problems.h"
#include "shared/vsa_layer_params.h"

namespace fva {

inline kern::LayerReserveHeader vsa_layer_record(const VsaLayerProblem& p) {
  const VsaProblem& f = p.fine;
  kern::LayerReserveHeader r;
  std::memset(&r, 0, sizeof r);
  r.magic = kern::kLayerReserveMagic;
  r.version = kern::kLayerReserveVersion;
  r.dtype = f.dtype;
  r.gate = p.gate ? 1 : 0;
  r.B = f.B;
  r.Hq = f.Hq;
  r.Hkv = f.Hkv;
  r.nq = f.num_q_blocks;
  r.nkv = f.num_kv_blocks;
  r.D = f.D;
  r.topk = p.topk;
  std::memcpy(&r.scale_bits, &f.scale, sizeof r.scale_bits);
  return r;
}

}  // namespace fva
