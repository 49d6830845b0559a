// How the fuzz replay judges a call run on the CPU backend (the oracle) and again on a target
// handle: which pairs of statuses the contract allows, and whether the target's outputs agree with
// the CPU's within SPEC section 4's bounds, the measure the GPU suites use (rel_l2_floored).
#pragma once

#include <fvattn/fvattn.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_call.h"

namespace fvafuzz {

// One arena's bytes as a backend left them, and the address its tensors' data pointers are
// relative to (the arena's start in that backend's memory).
struct ArenaImage {
  const uint8_t* bytes = nullptr;
  size_t size = 0;
  uintptr_t base = 0;
};

// What the replay knows of the two runs of one call, to judge their statuses.
struct StatusPair {
  fva_status_t cpu = FVA_OK, target = FVA_OK;
  std::string cpu_message, target_message;
  bool target_is_cuda = false;
  // The two workspace queries' answers (0 when a query failed or there is none).
  size_t cpu_need = 0, target_need = 0;
};

enum class Verdict {
  kSame,             // the same status: compare outputs (OK) or check that nothing changed
  kUnsupported,      // the target (CUDA) has no kernel for a problem the CPU backend runs
  kWorkspaceChoice,  // a bad workspace choice that only one side's query made matter (one needs 0)
  kReserveInKernel,  // layer backward: the CPU refuses the reserve on the host, the CUDA kernels
                     // refuse it on the device (FVA_OK, outputs untouched), as fvattn.h documents
  kMismatch,
};
const char* verdict_name(Verdict v);

// Whether the statuses agree as the contract says they must; *why explains a mismatch.
Verdict judge_status(const Call& c, const StatusPair& s, std::string* why);

// The SPEC bound an output of the call is held to against the CPU backend: 1e-2 for attention
// outputs, 1e-3 for lse, 0 for what must agree bit for bit (index outputs, NVFP4 quantization); a
// negative bound for outputs that are not compared (the opaque reserve).
double output_tolerance(const Call& c, size_t arg);

// Compares output argument `arg` (whose data pointers lie in arena images a, from the CPU, and b,
// from the target): NaN and infinities at the same elements, the rest within `tol` (rel_l2_floored)
// or bit for bit (tol 0). Returns an empty string when they agree, else what differs.
std::string compare_output(const Call& cpu, const Call& target, size_t arg, const ArenaImage& a,
                           const ArenaImage& b, double tol, double* err);

// For each byte of an arena (at `base` in the memory c's data pointers point into), whether an
// output (outputs true: element by element) or an input (false: its whole byte range) argument of
// c addresses it. Arguments whose geometry breaks the tensor rules or leaves the arena are left
// out: a call with such an argument fails.
std::vector<bool> tensor_bytes(const Call& c, size_t arena, uintptr_t base, size_t size, bool outputs);

}  // namespace fvafuzz
