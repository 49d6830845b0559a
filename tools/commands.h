// The GPU commands of the fvattn tool (tools/bench.cpp, tools/demo_gpu.cpp, built when the tool is
// built with CUDA, FVATTN_TOOLS_GPU) and the soak (tools/soak.cpp, every build); tools/fvattn.cpp
// dispatches to them.
#pragma once

#include <fvattn/fvattn.h>

#include <cstdint>

namespace fvtool {

struct BenchOptions;
struct SoakOptions;

// `fvattn bench` with its parsed options (tools/bench_options.h), on the GPU that tools/fvattn.cpp
// found; returns the exit status.
int cmd_bench(const BenchOptions& o);

// `fvattn demo` on the GPU of handle h (a CUDA handle with a kernel image); returns the exit status.
int demo_gpu(fva_handle_t h, int64_t heads, int64_t seq, uint64_t seed, int runs);

// `fvattn soak` with its parsed options (tools/soak_options.h): on the GPU that tools/fvattn.cpp
// found, or with --backend cpu on a second CPU handle; returns the exit status.
int cmd_soak(const SoakOptions& o);

}  // namespace fvtool
