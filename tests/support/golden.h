// Access to tests/golden (FVA_GOLDEN_DIR): the case folders, their tensors and the few case.json
// fields the tests need. Golden tensors are contiguous [B, H, S, D] (lse [B, H, S]); bf16 ones are
// stored as uint16 bit patterns.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "reference64.h"

namespace fvt {

std::string golden_dir();  // FVA_GOLDEN_DIR

struct GoldenCase {
  std::string kind;  // "qat", "vsa" or "vsa_layer"
  std::string name;
  std::string dir;
  // From case.json (QAT cases only; VSA's case.json has just the tensor list).
  std::map<std::string, bool> preset;  // FastVideo's flag names
  bool causal = false;
  double sm_scale = 0.0;
  // From case.json (VSA layer cases only).
  int64_t topk = 0;
  bool gate = false;

  bool flag(const std::string& key) const;  // throws if the preset lacks it
  std::string path(const std::string& tensor) const { return dir + "/" + tensor + ".npy"; }
};

// Every case of a kind, sorted by name. Throws if the folder is missing or empty, so a broken
// checkout fails instead of passing with nothing tested.
std::vector<GoldenCase> list_golden(const std::string& kind);

// A bf16 tensor as ref64 doubles (exact), with its shape; throws unless it is rank 4 '<u2'.
ref64::Tensor golden_tensor(const GoldenCase& c, const std::string& name);
std::vector<uint16_t> golden_bits(const GoldenCase& c, const std::string& name);
std::vector<double> golden_f32(const GoldenCase& c, const std::string& name);
std::vector<int32_t> golden_i32(const GoldenCase& c, const std::string& name);
std::vector<int64_t> golden_shape(const GoldenCase& c, const std::string& name);

// The QAT configuration of a case, mapped from FastVideo's flags to ours (SPEC section 2):
// two_level_quant_P wins over use_global_sf_P.
ref64::QatConfig golden_qat_config(const GoldenCase& c);

}  // namespace fvt
