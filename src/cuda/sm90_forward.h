// The Hopper-native forward (kernels/hopper/): when a call may use it, and its launch. QAT attention
// and VSA ask here first and fall back to the portable kernels when the answer is no.
#pragma once

#include <cstdint>

#include "common/kernel_params.h"
#include "handle.h"

namespace fva::cuda {

enum class Sm90Forward { kQat, kVsa };

// Encodes the TMA maps of a.q, a.k, a.v into *params and returns true when the sm_90a forward can
// run this call: an sm_90 device, a handle that allows native kernels (FVA_KERNELS_AUTO), D 64 or
// 128, and tensors the TMA can address (the driver accepts their maps). QAT also needs P in block
// scales or unquantized (its tile and row P scales run on the portable kernel).
bool sm90_forward_prepare(const fva_handle& h, Sm90Forward kind, const kern::AttentionParams& a,
                          int64_t D, bool quantize_p, int32_t p_scale,
                          kern::Sm90ForwardParams* params);

// Launches the forward prepared above (asynchronous, on `stream`).
void sm90_forward_launch(const fva_handle& h, Sm90Forward kind, const kern::Sm90ForwardParams& params,
                         int64_t D, int32_t dtype, bool quantize_p, void* stream);

}  // namespace fva::cuda
