#include "demo_checks.h"

#include <cmath>

namespace fvtool {

double rel_l2(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(got[i]) && std::isinf(want[i]) && got[i] == want[i]) continue;
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) return NAN;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

std::vector<std::pair<std::string, double>> layer_reference_errors(
    const ref64::VsaLayerInputs& in, const ref64::Tensor& dout, int64_t k, std::vector<int32_t> q2k_idx,
    std::vector<int32_t> q2k_num, const std::vector<double>& out, const std::vector<double>& dq,
    const std::vector<double>& dk, const std::vector<double>& dv, const std::vector<double>& dgate) {
  ref64::VsaLayerConfig rc;
  rc.topk = k;
  ref64::VsaLayerSelection chosen;
  chosen.k = k;
  chosen.q2k_idx = std::move(q2k_idx);
  chosen.q2k_num = std::move(q2k_num);
  const ref64::VsaLayerForward ref = ref64::vsa_layer_forward(rc, ref64::DType::BF16, in, &chosen);
  const ref64::VsaLayerGrads g = ref64::vsa_layer_backward(rc, ref64::DType::BF16, in, ref, dout);
  const ref64::Shape& s = in.q.shape;
  const ref64::SelectionCheck lists = ref64::check_selection(
      ref64::DType::BF16, chosen.q2k_idx, chosen.q2k_num, ref.scores, in.kv_block_sizes, s.B * s.H * (s.S / 64), k);
  return {{"out", rel_l2(out, ref.out.data)},
          {"dq", rel_l2(dq, g.dq.data)},
          {"dk", rel_l2(dk, g.dk.data)},
          {"dv", rel_l2(dv, g.dv.data)},
          {"dgate", rel_l2(dgate, g.dgate.data)},
          {"lists", static_cast<double>(lists.bad_rows)}};
}

}  // namespace fvtool
