// `fvattn soak`'s options (tools/soak.cpp): the soak runs on a GPU, or with --backend cpu on the
// CPU backend in any build.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace fvtool {

struct SoakOptions {
  double minutes = 1.0;
  int threads = 4;
  uint64_t seed = 0;
  bool seed_set = false;
  int check_every = 10;
  int64_t max_seq = 1024;
  double slack_mib = 64.0;
  std::string backend = "cuda";  // the handle under test: "cuda", or "cpu" (a second CPU handle)
};

inline void add_soak_options(CLI::App& cmd, SoakOptions& o) {
  cmd.add_option("--minutes", o.minutes, "how long to run (a fraction is fine)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--threads", o.threads, "threads sharing the one CUDA handle, each with its own streams")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd.add_option_function<uint64_t>(
      "--seed", [&o](const uint64_t& s) { o.seed = s, o.seed_set = true; },
      "random seed (default: fresh each run, printed)");
  cmd.add_option("--check-every", o.check_every,
                 "compare every K-th call of each thread with the CPU backend (1: every call)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--max-seq", o.max_seq, "the longest sequence a problem draws (tokens)")
      ->check(CLI::Range(int64_t{64}, int64_t{1} << 16))
      ->capture_default_str();
  cmd.add_option("--backend", o.backend,
                 "the backend under test: cuda, or cpu (the same calls on a second CPU handle over host "
                 "memory: a test of the soak itself, in any build)")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  cmd.add_option("--slack-mib", o.slack_mib, "device memory growth (MiB) tolerated from start to end")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.footer(
      "Runs random calls of every operation (QAT forward and backward, plain and quantized; VSA\n"
      "forward and backward; the whole VSA layer forward and backward; NVFP4 quantization; index\n"
      "inversion) over random shapes, configs, bf16/f16, BHSD/BSHD and padded rows, with ragged,\n"
      "empty, out-of-range and duplicated block metadata, from several threads on one handle, each\n"
      "thread on its own streams; a sample is checked against the CPU backend. Progress every 30 s;\n"
      "exit status 1 on any mismatch, unexpected status, device error or memory growth.");
}

}  // namespace fvtool
