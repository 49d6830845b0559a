// A handle's tuning options (fva_handle_options_t's fields after `kernels`), resolved once by
// fva_create: each field left FVA_OPTION_AUTO takes the default its environment variable supplies,
// else the library's. This file is the one place the library reads its environment variables.
#pragma once

#include <cstdint>

#include "fvattn/fvattn.h"

namespace fva {

struct TuningOptions {
  // The sm_90 QAT forward's tail split: FVA_OPTION_AUTO (the planner's choice per call), 0 (never)
  // or 2..8 pieces (1 is stored as 0).
  int32_t qat_forward_split = FVA_OPTION_AUTO;
  bool qat_forward_clusters = true;  // where they apply
  int32_t ds_budget_mib = 2048;      // 0: no stored dS
  bool chained_launches = true;      // where device and driver support them
  int32_t cpu_threads = 1;
  bool ptx_jit = false;  // CUDA: the PTX images through the driver's JIT, even where SASS fits

  int64_t ds_budget_bytes() const { return static_cast<int64_t>(ds_budget_mib) << 20; }
};

constexpr int32_t kMaxForwardSplitOption = 8;
constexpr int32_t kMaxDsBudgetMib = int32_t{1} << 30;
constexpr int32_t kMaxCpuThreads = 4096;

// The options of `o` resolved. Throws FVA_ERR_INVALID_ARGUMENT for a field out of range, or for an
// environment variable that supplies an AUTO field's default and is malformed (the message names
// the variable and what it accepts).
TuningOptions resolve_tuning_options(const fva_handle_options_t& o);

// Whether the environment variable `name` is set to a non-empty value other than "0" (a process-wide
// switch, read once where it applies; FVATTN_DISABLE_CUDA).
bool env_flag_set(const char* name);

}  // namespace fva
