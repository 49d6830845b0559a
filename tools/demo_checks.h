// What both of `fvattn demo`'s runs (the CPU backend's, tools/fvattn.cpp, and the GPU's,
// tools/demo_gpu.cpp) measure against the float64 reference (tools/reference64).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "reference64.h"

namespace fvtool {

// Relative L2 error; NaN (never a pass) when either side has a NaN. Entries where both are the same
// infinity (empty rows' lse) agree and are left out; one-sided infinities give NaN.
double rel_l2(const std::vector<double>& got, const std::vector<double>& want);

// The library's whole VSA layer (forward and backward, bf16, with gate) against the float64 reference
// over the library's own selection (q2k_idx, q2k_num as the forward returned them, k entries per
// row): the rel L2 errors of out, dq, dk, dv and dgate, then "lists", the number of q blocks whose
// list SPEC 3b does not allow for the reference's scores (one-step ties allowed: 0 passes).
std::vector<std::pair<std::string, double>> layer_reference_errors(
    const ref64::VsaLayerInputs& in, const ref64::Tensor& dout, int64_t k, std::vector<int32_t> q2k_idx,
    std::vector<int32_t> q2k_num, const std::vector<double>& out, const std::vector<double>& dq,
    const std::vector<double>& dk, const std::vector<double>& dv, const std::vector<double>& dgate);

}  // namespace fvtool
