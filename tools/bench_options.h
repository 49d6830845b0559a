// `fvattn bench`'s options and their command-line parsing (CLI11), shared by tools/fvattn.cpp (which
// parses them in every build, so that `fvattn bench --help` works without CUDA too) and
// tools/bench.cpp (which runs the benchmark, in the CUDA build only).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace fvtool {

struct BenchOptions {
  int64_t B = 1, H = 8, D = 128;
  std::vector<int64_t> seqs = {4096, 16384, 32768};
  int warmup = 3, iters = 20;
  double density = 0.25;
  bool local_lists = false;     // --lists local: video-like lists (vsa_lists)
  bool qat = true, vsa = true;  // --ops: which ops run
  // --layer T,H,W: the whole VSA layer on that token grid (FastVideo's 4x4x4 tiles), against its
  // fine branch alone with the same lists; --topk: its kv blocks per q block.
  std::vector<int64_t> layer_grid;
  int64_t layer_topk = 78;
  bool plain = false;  // --qat-preset plain: QAT's unquantized mode (plain attention)
  std::string json_path;
  bool sdpa = true;
  // --settle: seconds the GPU idles before each op's warm-up (PyTorch's SDPA's too), so that every
  // op starts from a rested card instead of the power state the ops before it left (0: none).
  double settle_s = 0.0;
  std::string kernels = "auto";  // --kernels auto|portable|both
  int32_t deterministic = 0;     // --deterministic
  // --ds-budget-mib: the handles' ds_budget_mib (the sm_90 backwards' stored-dS workspace, whose
  // size also decides how many (batch, kv head) chunks they run in); -1: the library's default.
  int32_t ds_budget_mib = -1;
  // --suite round2: the shapes users run (the attention table of speed round two: short sequences,
  // D = 64, causal, B > 1, GQA, fp16, ThunderKittens' VSA point, Wan's length), instead of --seq
  // over --batch/--heads/--dim.
  std::string suite;
};

// Raw values that need a check across options after parsing (finish_bench_options).
struct BenchParse {
  std::string lists = "random", ops = "qat,vsa", preset = "production";
  bool deterministic = false, no_sdpa = false;
};

inline void add_bench_options(CLI::App& cmd, BenchOptions& o, BenchParse& p) {
  cmd.footer(
      "--kernels both: every op twice, the portable kernels' rows marked '/portable'.\n"
      "--deterministic: on sm_90 the QAT backward at D = 128 then runs its dQ kernel instead of\n"
      "  dQ fused into dK/dV.\n"
      "--lists local: each q block picks the kv blocks nearest it in a (t, y, x) tile grid, with\n"
      "  noise, so neighbours share most of their picks (random, the default, is what the headline\n"
      "  figures use).\n"
      "--suite round2: B=1 H=8 S=16384 and 4096 (QAT, VSA 25%), H=12 S=49152 top-76 of 768 (VSA),\n"
      "  H=16 D=64, causal (QAT), B=2, GQA 8:2, fp16, and Wan's H=40 S=32760 (QAT); 'vs cuDNN' is\n"
      "  each op's TFLOPS over cuDNN's dense attention's at the same shape and direction.\n"
      "--layer: the whole VSA layer (with gate) on a T,H,W token grid in FastVideo's 4x4x4 tiles,\n"
      "  then its fine branch alone over the same lists (rows layer_*; layer_over_fine is the\n"
      "  layer's forward + backward over the fine branch's, in its ms column); --ops layer runs it\n"
      "  alone.\n"
      "SM MHz and W: NVML's SM clock and instantaneous board power over each op's timed calls\n"
      "(medians); the driver refreshes both about every 100 ms, so an op that takes less shows the\n"
      "reading from before it. Needs an NVIDIA GPU; `fvattn demo` checks the library on the CPU.");
  cmd.add_option("--seq", o.seqs, "sequence lengths, multiples of 64 (default 4096,16384,32768)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->option_text("S,S,...");
  cmd.add_option("--batch", o.B, "batch size")->check(CLI::PositiveNumber)->capture_default_str();
  cmd.add_option("--heads", o.H, "heads")->check(CLI::PositiveNumber)->capture_default_str();
  cmd.add_option("--dim", o.D, "head dimension")->check(CLI::PositiveNumber)->capture_default_str();
  cmd.add_option("--iters", o.iters, "timed calls per op (their median is reported)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--warmup", o.warmup, "untimed calls before them")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--density", o.density, "VSA: the fraction of kv blocks each q block attends")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd.add_option("--json", o.json_path, "also write the results to FILE as JSON")
      ->option_text("FILE");
  cmd.add_flag("--no-sdpa", p.no_sdpa, "do not time PyTorch's SDPA alongside");
  cmd.add_option("--kernels", o.kernels, "the handle's kernel choice (FVA_KERNELS_*)")
      ->check(CLI::IsMember({"auto", "portable", "both"}))
      ->capture_default_str();
  cmd.add_flag("--deterministic", p.deterministic, "deterministic handles");
  cmd.add_option("--ds-budget-mib", o.ds_budget_mib,
                 "the handles' ds_budget_mib: MiB of workspace for the sm_90 backwards' stored dS "
                 "(0: never stored; default: the library's)")
      ->check(CLI::Range(0, 1 << 30))
      ->option_text("MIB");
  cmd.add_option("--lists", p.lists, "VSA's q2k lists")
      ->check(CLI::IsMember({"random", "local"}))
      ->capture_default_str();
  cmd.add_option("--ops", p.ops, "which of the library's ops run (PyTorch's SDPA runs unless --no-sdpa)")
      ->check(CLI::IsMember({"qat", "vsa", "qat,vsa", "vsa,qat", "layer"}))
      ->option_text("qat|vsa|qat,vsa|layer (default qat,vsa)");
  cmd.add_option("--qat-preset", p.preset,
                 "production (FastVideo's preset; rows qat_*) or plain (quantize = 0; rows plain_*)")
      ->check(CLI::IsMember({"production", "plain"}))
      ->capture_default_str();
  cmd.add_option("--settle", o.settle_s,
                 "seconds the GPU idles before each op (SDPA's too); 0: back to back, as training runs")
      ->check(CLI::Range(0.0, 600.0))
      ->capture_default_str();
  cmd.add_option("--layer", o.layer_grid, "the whole VSA layer on a T,H,W token grid")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->option_text("T,H,W");
  cmd.add_option("--topk", o.layer_topk, "--layer: kv blocks per q block")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--suite", o.suite,
                 "round2: a fixed list of shapes (each op's ratio to cuDNN's dense attention), "
                 "instead of --seq, --batch, --heads, --dim")
      ->check(CLI::IsMember({"round2"}))
      ->option_text("round2");
}

// Checks across options and resolves BenchParse into o; returns an error message, empty if none.
inline std::string finish_bench_options(BenchOptions& o, const BenchParse& p) {
  for (int64_t s : o.seqs)
    if (s % 64) return "--seq: sequence lengths must be multiples of 64 (VSA blocks), not " + std::to_string(s);
  if (o.seqs.empty()) return "--seq: needs at least one sequence length";
  if (!o.layer_grid.empty() && o.layer_grid.size() != 3)
    return "--layer: takes a token grid T,H,W (three numbers)";
  if (p.ops == "layer" && o.layer_grid.empty()) return "--ops layer: needs --layer T,H,W";
  if (!o.suite.empty() && p.ops == "layer") return "--suite: runs QAT and VSA shapes, not --ops layer";
  if (!(o.density > 0.0)) return "--density: must be above 0";
  o.local_lists = p.lists == "local";
  o.qat = p.ops.find("qat") != std::string::npos;
  o.vsa = p.ops.find("vsa") != std::string::npos;
  o.plain = p.preset == "plain";
  o.sdpa = !p.no_sdpa;
  o.deterministic = p.deterministic ? 1 : 0;
  return {};
}

}  // namespace fvtool
