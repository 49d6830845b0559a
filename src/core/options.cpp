#include "options.h"

#include <cerrno>
#include <cstdlib>
#include <string>
#include <thread>

#include "error.h"

namespace fva {
namespace {

// One option: its field's value, its name in messages, its environment variable, the whole numbers
// it accepts and whether the word "auto" stands for FVA_OPTION_AUTO.
struct OptionRule {
  const char* field;
  const char* env;
  int64_t min, max;
  const char* accepted;  // for messages
};

// The value of an AUTO field from `rule.env`: FVA_OPTION_AUTO when the variable is unset, empty or
// "auto"; else a whole number in [min, max], or FVA_ERR_INVALID_ARGUMENT.
int32_t env_default(const OptionRule& rule) {
  const char* env = std::getenv(rule.env);
  if (env == nullptr || *env == '\0' || std::string(env) == "auto") return FVA_OPTION_AUTO;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(env, &end, 10);
  if (errno != 0 || end == env || *end != '\0' || v < rule.min || v > rule.max)
    fail(FVA_ERR_INVALID_ARGUMENT,
         "the environment variable {}='{}' (the default of opts->{}) is not valid: expected auto "
         "or {}; fix or unset it, or set opts->{}",
         rule.env, env, rule.field, rule.accepted, rule.field);
  return static_cast<int32_t>(v);
}

// The field's value, or for FVA_OPTION_AUTO its environment default; either must be AUTO or lie
// in [min, max].
int32_t option_value(int32_t value, const OptionRule& rule) {
  if (value == FVA_OPTION_AUTO) return env_default(rule);
  if (value < rule.min || value > rule.max)
    fail(FVA_ERR_INVALID_ARGUMENT, "opts->{} is {} but must be FVA_OPTION_AUTO (-1) or {}",
         rule.field, value, rule.accepted);
  return value;
}

int32_t hardware_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int32_t>(hw < kMaxCpuThreads ? hw : kMaxCpuThreads);
}

}  // namespace

TuningOptions resolve_tuning_options(const fva_handle_options_t& o) {
  static const OptionRule kSplit{"qat_forward_split", "FVATTN_QAT_SPLIT", 0, kMaxForwardSplitOption,
                                 "a count of pieces from 0 to 8 (0 and 1: never split)"};
  static const OptionRule kClusters{"qat_forward_clusters", "FVATTN_QAT_CLUSTER", 0, 1, "0 or 1"};
  static const OptionRule kBudget{"ds_budget_mib", "FVATTN_DS_BUDGET_MIB", 0, kMaxDsBudgetMib,
                                  "a whole number of MiB from 0 (no stored dS) to 2^30"};
  static const OptionRule kChained{"chained_launches", "FVATTN_PDL", 0, 1, "0 or 1"};
  static const OptionRule kThreads{"cpu_threads", "FVATTN_NUM_THREADS", 1, kMaxCpuThreads,
                                   "a count of threads from 1 to 4096"};
  static const OptionRule kPtxJit{"ptx_jit", "FVATTN_PTX_JIT", 0, 1, "0 or 1"};
  TuningOptions t;
  const int32_t split = option_value(o.qat_forward_split, kSplit);
  t.qat_forward_split = split == 1 ? 0 : split;
  const int32_t clusters = option_value(o.qat_forward_clusters, kClusters);
  t.qat_forward_clusters = clusters != 0;  // AUTO: where they apply
  const int32_t budget = option_value(o.ds_budget_mib, kBudget);
  t.ds_budget_mib = budget == FVA_OPTION_AUTO ? 2048 : budget;
  const int32_t chained = option_value(o.chained_launches, kChained);
  t.chained_launches = chained != 0;  // AUTO: where supported
  const int32_t threads = option_value(o.cpu_threads, kThreads);
  t.cpu_threads = threads == FVA_OPTION_AUTO ? hardware_threads() : threads;
  t.ptx_jit = option_value(o.ptx_jit, kPtxJit) == 1;  // AUTO: SASS where it fits
  return t;
}

bool env_flag_set(const char* name) {
  const char* env = std::getenv(name);
  return env != nullptr && *env != '\0' && std::string(env) != "0";
}

}  // namespace fva
