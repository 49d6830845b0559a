// `fvattn bench`: forward and backward TFLOPS of QAT attention (FastVideo's production preset) and
// VSA (25% density) on the GPU, over a list of sequence lengths, with PyTorch's cuDNN SDPA (dense
// bf16) timed in the same run when PyTorch is importable. Timing follows docs/perf.md's method:
// CUDA events around each call, warm-up first, the median of the timed calls, input sets rotated so
// that they never sit in L2 between calls. Progress on stderr, the table on stdout, --json for
// machines.
//
// FLOPs (ARCHITECTURE.md): attention forward 4·B·H·Sq·Skv·D, backward 2.5x ("algorithmic", what every
// comparison uses); QAT also reports what its forward executes (6·B·H·S²·D: two P·V products); VSA
// counts only selected blocks (4·B·H·D·64·64·Σ q2k_num) and reports the dense-equivalent rate too.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <fvattn/fvattn.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench_options.h"
#include "commands.h"
#include "gpu_util.h"

namespace fvtool {
namespace {

// Lets the GPU idle for o.settle_s once the stream's work is done (nothing when 0).
void settle(const BenchOptions& o, cudaStream_t stream) {
  if (o.settle_s <= 0.0) return;
  cuda_check(cudaStreamSynchronize(stream), "settle");
  std::this_thread::sleep_for(std::chrono::duration<double>(o.settle_s));
}

struct Result {
  std::string op;
  int64_t S;
  double ms;
  double tflops;        // algorithmic
  double tflops_extra;  // QAT: executed; VSA: dense-equivalent; SDPA: 0
  ClockStats clocks{};  // the SM clock and power over the timed calls
};

std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d;
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    const float f = d(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    x = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  return v;
}

// VSA's q2k lists for `rows` (b, head) x nb q blocks, top-k each, ascending. Random (the default):
// each q block picks topk of the nb kv blocks uniformly, so neighbouring q blocks share a quarter of
// their picks at 25% density. Local (--lists local), a synthetic stand-in for video: the blocks are
// tiles of a (t, y, x) grid, 8 x 8 tiles a frame when nb allows, and a q block picks the kv blocks
// nearest to it in the grid (distance plus Gaussian noise of one tile), so neighbours share most.
std::vector<int32_t> vsa_lists(int64_t rows, int64_t nb, int64_t topk, bool local,
                               std::mt19937_64& rng) {
  std::vector<int32_t> idx(static_cast<size_t>(rows * nb * topk));
  std::vector<int32_t> all(static_cast<size_t>(nb));
  for (int64_t i = 0; i < nb; ++i) all[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  int64_t side = 1;
  for (int64_t s = 8; s > 1; s /= 2)
    if (nb % (s * s) == 0) {
      side = s;
      break;
    }
  std::normal_distribution<double> noise;
  std::vector<std::pair<double, int32_t>> score(static_cast<size_t>(nb));
  for (int64_t r = 0; r < rows * nb; ++r) {
    if (!local) {
      std::shuffle(all.begin(), all.end(), rng);  // the same lists for a given seed
    } else {
      const int64_t q = r % nb, qt = q / (side * side), qy = q / side % side, qx = q % side;
      for (int64_t k = 0; k < nb; ++k) {
        const double dt = static_cast<double>(k / (side * side) - qt);
        const double dy = static_cast<double>(k / side % side - qy);
        const double dx = static_cast<double>(k % side - qx);
        score[static_cast<size_t>(k)] = {std::sqrt(dt * dt + dy * dy + dx * dx) + noise(rng),
                                         static_cast<int32_t>(k)};
      }
      std::partial_sort(score.begin(), score.begin() + topk, score.end());
      for (int64_t i = 0; i < topk; ++i) all[static_cast<size_t>(i)] = score[static_cast<size_t>(i)].second;
    }
    std::sort(all.begin(), all.begin() + topk);
    std::copy(all.begin(), all.begin() + topk, idx.begin() + r * topk);
  }
  return idx;
}

// How much four consecutive q blocks' lists overlap: their union's size over the sum of their
// lengths, averaged (1: nothing shared; 0.25: identical lists).
double union_ratio(const std::vector<int32_t>& idx, int64_t rows, int64_t nb, int64_t topk) {
  double sum = 0;
  int64_t groups = 0;
  std::vector<char> seen(static_cast<size_t>(nb));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t q0 = 0; q0 + 4 <= nb; q0 += 4, ++groups) {
      std::fill(seen.begin(), seen.end(), 0);
      int64_t n = 0;
      for (int64_t q = q0; q < q0 + 4; ++q)
        for (int64_t i = 0; i < topk; ++i) {
          char& s = seen[static_cast<size_t>(idx[static_cast<size_t>((r * nb + q) * topk + i)])];
          n += !s;
          s = 1;
        }
      sum += static_cast<double>(n) / static_cast<double>(4 * topk);
    }
  return groups > 0 ? sum / static_cast<double>(groups) : 1.0;
}

// How many copies of a working set keep the rotation above 100 MiB (H200 L2: 50 MiB), at most 4.
int rotation_sets(size_t bytes_per_set) {
  const size_t target = 100u << 20;
  return static_cast<int>(std::max<size_t>(1, std::min<size_t>(4, (target + bytes_per_set - 1) / bytes_per_set)));
}

struct AttnSet {
  DeviceArray q, k, v, o, o_hp, lse, dout, dq, dk, dv;
};

AttnSet make_set(int64_t B, int64_t H, int64_t S, int64_t D, std::mt19937_64& rng) {
  const size_t n = static_cast<size_t>(B * H * S * D), bytes = n * 2;
  AttnSet s{DeviceArray(bytes), DeviceArray(bytes), DeviceArray(bytes), DeviceArray(bytes),
            DeviceArray(bytes), DeviceArray(static_cast<size_t>(B * H * S) * 4), DeviceArray(bytes),
            DeviceArray(bytes), DeviceArray(bytes), DeviceArray(bytes)};
  for (DeviceArray* a : {&s.q, &s.k, &s.v, &s.dout}) a->upload(random_bf16(n, rng));
  return s;
}

void bench_shape(fva_handle_t h, const BenchOptions& o, int64_t S, std::mt19937_64& rng,
                 cudaStream_t stream, ClockSampler& clocks, std::vector<Result>& out) {
  ClockStats seen;
  auto timed = [&](const std::function<void(int)>& fn) {
    settle(o, stream);
    return median_ms(stream, o.warmup, o.iters, fn, 4000.0, &clocks, &seen);
  };
  const int64_t B = o.B, H = o.H, D = o.D;
  const int sets = rotation_sets(static_cast<size_t>(4 * B * H * S * D * 2));
  std::vector<AttnSet> a;
  for (int i = 0; i < sets; ++i) a.push_back(make_set(B, H, S, D, rng));
  auto t4 = [&](const DeviceArray& d) { return contiguous(d.get(), FVA_DTYPE_BF16, {B, H, S, D}); };
  auto t3 = [&](const DeviceArray& d) { return contiguous(d.get(), FVA_DTYPE_F32, {B, H, S}); };
  const double dense = 4.0 * B * H * static_cast<double>(S) * S * D;

  double ms = 0.0;
  if (o.qat) {  // ---- QAT: the production preset, or plain attention (quantize = 0) ----
    fva_qat_config_t cfg = FVA_QAT_CONFIG_INIT;
    if (o.plain) cfg.quantize = 0;
    const std::string fwd_op = o.plain ? "plain_forward" : "qat_forward";
    const std::string bwd_op = o.plain ? "plain_backward" : "qat_backward";
    size_t fb = 0, bb = 0;
    {
      const fva_tensor_t q = t4(a[0].q), k = t4(a[0].k), v = t4(a[0].v);
      fva_check(fva_qat_forward_workspace_size(h, &cfg, &q, &k, &v, &fb), "qat workspace");
      fva_check(fva_qat_backward_workspace_size(h, &cfg, &q, &k, &v, &bb), "qat workspace");
    }
    DeviceArray ws(std::max(fb, bb));
    auto qat_fwd = [&](int i) {
      const AttnSet& s = a[static_cast<size_t>(i % sets)];
      const fva_tensor_t q = t4(s.q), k = t4(s.k), v = t4(s.v), oo = t4(s.o), oh = t4(s.o_hp), l = t3(s.lse);
      fva_check(fva_qat_forward(h, &cfg, &q, &k, &v, &oo, &oh, &l, ws.get(), fb, stream), "fva_qat_forward");
    };
    fmt::print(stderr, "bench S={}: {} ...\n", S, fwd_op);
    ms = timed(qat_fwd);
    // Executed: the quantized forward runs both P·V products (1.5x the algorithmic FLOPs).
    out.push_back({fwd_op, S, ms, dense / (ms * 1e9), o.plain ? 0.0 : 1.5 * dense / (ms * 1e9), seen});
    for (int i = 0; i < sets; ++i) qat_fwd(i);  // o_hp and lse for the backward
    auto qat_bwd = [&](int i) {
      const AttnSet& s = a[static_cast<size_t>(i % sets)];
      const fva_tensor_t q = t4(s.q), k = t4(s.k), v = t4(s.v), oh = t4(s.o_hp), l = t3(s.lse),
                         d = t4(s.dout), gq = t4(s.dq), gk = t4(s.dk), gv = t4(s.dv);
      fva_check(fva_qat_backward(h, &cfg, &q, &k, &v, &oh, &l, &d, &gq, &gk, &gv, ws.get(), bb, stream),
                "fva_qat_backward");
    };
    fmt::print(stderr, "bench S={}: {} ...\n", S, bwd_op);
    ms = timed(qat_bwd);
    out.push_back({bwd_op, S, ms, 2.5 * dense / (ms * 1e9), 0.0, seen});
  }
  if (!o.vsa) return;

  // ---- VSA at the requested density: each q block lists top-k = nblocks * density kv blocks ----
  const int64_t nb = S / 64, topk = std::max<int64_t>(1, static_cast<int64_t>(nb * o.density));
  const std::vector<int32_t> idx = vsa_lists(B * H, nb, topk, o.local_lists, rng);
  const std::vector<int32_t> num(static_cast<size_t>(B * H * nb), static_cast<int32_t>(topk));
  DeviceArray didx(idx.size() * 4), dnum(num.size() * 4), dsizes(static_cast<size_t>(nb) * 4);
  didx.upload(idx);
  dnum.upload(num);
  dsizes.upload(std::vector<int32_t>(static_cast<size_t>(nb), 64));
  const fva_tensor_t ti = contiguous(didx.get(), FVA_DTYPE_I32, {B, H, nb, topk});
  const fva_tensor_t tn = contiguous(dnum.get(), FVA_DTYPE_I32, {B, H, nb});
  const fva_tensor_t ts = contiguous(dsizes.get(), FVA_DTYPE_I32, {nb});
  const fva_vsa_config_t vcfg = FVA_VSA_CONFIG_INIT;
  size_t vb = 0, vfb = 0;  // one workspace serves the forward and the backward
  {
    const fva_tensor_t q = t4(a[0].q), k = t4(a[0].k), v = t4(a[0].v);
    fva_check(fva_vsa_forward_workspace_size(h, &vcfg, &q, &k, &v, &ti, &vfb), "vsa workspace");
    fva_check(fva_vsa_backward_workspace_size(h, &vcfg, &q, &k, &v, &ti, &vb), "vsa workspace");
  }
  vb = std::max(vb, vfb);
  DeviceArray vws(vb);
  const double sparse = 4.0 * B * H * D * 64.0 * 64.0 * static_cast<double>(nb * topk);
  const double density = static_cast<double>(topk) / static_cast<double>(nb);
  auto vsa_fwd = [&](int i) {
    const AttnSet& s = a[static_cast<size_t>(i % sets)];
    const fva_tensor_t q = t4(s.q), k = t4(s.k), v = t4(s.v), oo = t4(s.o), l = t3(s.lse);
    fva_check(fva_vsa_forward(h, &vcfg, &q, &k, &v, &ti, &tn, &ts, &oo, &l, vws.get(), vb, stream),
              "fva_vsa_forward");
  };
  fmt::print(stderr,
             "bench S={}: VSA forward (top-k {} of {} blocks, {} lists: 4 neighbours' union {:.0f}% "
             "of their sum) ...\n",
             S, topk, nb, o.local_lists ? "local" : "random",
             100.0 * union_ratio(idx, B * H, nb, topk));
  ms = timed(vsa_fwd);
  out.push_back({"vsa_forward", S, ms, sparse / (ms * 1e9), sparse / density / (ms * 1e9), seen});
  for (int i = 0; i < sets; ++i) vsa_fwd(i);
  auto vsa_bwd = [&](int i) {
    const AttnSet& s = a[static_cast<size_t>(i % sets)];
    const fva_tensor_t q = t4(s.q), k = t4(s.k), v = t4(s.v), oo = t4(s.o), l = t3(s.lse),
                       d = t4(s.dout), gq = t4(s.dq), gk = t4(s.dk), gv = t4(s.dv);
    fva_check(fva_vsa_backward(h, &vcfg, &q, &k, &v, &oo, &l, &d, &ti, &tn, &ts, &gq, &gk, &gv,
                               vws.get(), vb, stream),
              "fva_vsa_backward");
  };
  fmt::print(stderr, "bench S={}: VSA backward ...\n", S);
  ms = timed(vsa_bwd);
  out.push_back({"vsa_backward", S, ms, 2.5 * sparse / (ms * 1e9), 2.5 * sparse / density / (ms * 1e9),
                 seen});
}

// The whole VSA layer (fva_vsa_layer_forward/backward, with gate) on o.layer_grid, and its fine
// branch alone (fva_vsa_forward/backward over the lists the layer selected): the layer's cost over
// the fine branch's is what its block means, coarse attention, selection and gate add.
void bench_layer(fva_handle_t h, const BenchOptions& o, std::mt19937_64& rng, cudaStream_t stream,
                 ClockSampler& clocks, std::vector<Result>& out) {
  ClockStats seen;
  auto timed = [&](const std::function<void(int)>& fn) {
    settle(o, stream);
    return median_ms(stream, o.warmup, o.iters, fn, 4000.0, &clocks, &seen);
  };
  const int32_t tile[3] = {4, 4, 4};
  int64_t nb = 0;
  fva_check(fva_vsa_tile_plan(o.layer_grid.data(), tile, nullptr, nullptr, &nb), "fva_vsa_tile_plan");
  std::vector<int32_t> sizes(static_cast<size_t>(nb));
  fva_check(fva_vsa_tile_plan(o.layer_grid.data(), tile, nullptr, sizes.data(), &nb), "fva_vsa_tile_plan");
  const int64_t B = o.B, H = o.H, D = o.D, S = 64 * nb, topk = std::min(o.layer_topk, nb);
  const size_t n = static_cast<size_t>(B * H * S * D), bytes = n * 2;
  DeviceArray q(bytes), k(bytes), v(bytes), gate(bytes), o_(bytes), dout(bytes), dq(bytes), dk(bytes),
      dv(bytes), dgate(bytes), lse(static_cast<size_t>(B * H * S) * 4);
  for (DeviceArray* a : {&q, &k, &v, &gate, &dout}) a->upload(random_bf16(n, rng));
  DeviceArray dsizes(sizes.size() * 4), didx(static_cast<size_t>(B * H * nb * topk) * 4),
      dnum(static_cast<size_t>(B * H * nb) * 4);
  dsizes.upload(sizes);
  auto t4 = [&](const DeviceArray& d) { return contiguous(d.get(), FVA_DTYPE_BF16, {B, H, S, D}); };
  const fva_tensor_t tq = t4(q), tk = t4(k), tv = t4(v), tg = t4(gate), to = t4(o_), td = t4(dout),
                     tdq = t4(dq), tdk = t4(dk), tdv = t4(dv), tdg = t4(dgate);
  const fva_tensor_t ts = contiguous(dsizes.get(), FVA_DTYPE_I32, {nb});
  const fva_tensor_t ti = contiguous(didx.get(), FVA_DTYPE_I32, {B, H, nb, topk});
  const fva_tensor_t tn = contiguous(dnum.get(), FVA_DTYPE_I32, {B, H, nb});
  const fva_tensor_t tl = contiguous(lse.get(), FVA_DTYPE_F32, {B, H, S});
  fva_vsa_layer_config_t cfg = FVA_VSA_LAYER_CONFIG_INIT;
  cfg.topk = static_cast<int32_t>(topk);
  size_t wb = 0, rb = 0;
  fva_check(fva_vsa_layer_sizes(h, &cfg, &tq, &tk, &tv, &wb, &rb), "fva_vsa_layer_sizes");
  DeviceArray reserve(rb);
  const fva_vsa_config_t vcfg = FVA_VSA_CONFIG_INIT;
  size_t fb = 0, bb = 0;
  fva_check(fva_vsa_forward_workspace_size(h, &vcfg, &tq, &tk, &tv, &ti, &fb), "vsa workspace");
  fva_check(fva_vsa_backward_workspace_size(h, &vcfg, &tq, &tk, &tv, &ti, &bb), "vsa workspace");
  const size_t ws_bytes = std::max({wb, fb, bb});
  DeviceArray ws(ws_bytes);
  const double sparse = 4.0 * B * H * D * 64.0 * 64.0 * static_cast<double>(nb * topk);
  fmt::print(stderr, "bench layer {}x{}x{} ({} blocks, S={}, top-k {}): forward ...\n", o.layer_grid[0],
             o.layer_grid[1], o.layer_grid[2], nb, S, topk);
  auto layer_fwd = [&](int) {
    fva_check(fva_vsa_layer_forward(h, &cfg, &tq, &tk, &tv, &tg, &ts, &ts, &to, &ti, &tn,
                                    reserve.get(), rb, ws.get(), ws_bytes, stream),
              "fva_vsa_layer_forward");
  };
  const double lf = timed(layer_fwd);
  out.push_back({"layer_forward", S, lf, sparse / (lf * 1e9), 0.0, seen});
  layer_fwd(0);
  fmt::print(stderr, "bench layer: backward ...\n");
  const double lb = timed([&](int) {
    fva_check(fva_vsa_layer_backward(h, &cfg, &tq, &tk, &tv, &tg, &ts, &ts, &td, reserve.get(), rb,
                                     &tdq, &tdk, &tdv, &tdg, ws.get(), ws_bytes, stream),
              "fva_vsa_layer_backward");
  });
  out.push_back({"layer_backward", S, lb, 2.5 * sparse / (lb * 1e9), 0.0, seen});
  // The fine branch alone over the layer's own lists (left in ti, tn by the forward above).
  fmt::print(stderr, "bench layer: the fine branch alone ...\n");
  auto fine_fwd = [&](int) {
    fva_check(fva_vsa_forward(h, &vcfg, &tq, &tk, &tv, &ti, &tn, &ts, &to, &tl, ws.get(), ws_bytes,
                              stream),
              "fva_vsa_forward");
  };
  const double ff = timed(fine_fwd);
  out.push_back({"layer_fine_forward", S, ff, sparse / (ff * 1e9), 0.0, seen});
  fine_fwd(0);
  const double fbw = timed([&](int) {
    fva_check(fva_vsa_backward(h, &vcfg, &tq, &tk, &tv, &to, &tl, &td, &ti, &tn, &ts, &tdq, &tdk,
                               &tdv, ws.get(), ws_bytes, stream),
              "fva_vsa_backward");
  });
  out.push_back({"layer_fine_backward", S, fbw, 2.5 * sparse / (fbw * 1e9), 0.0, seen});
  out.push_back({"layer_over_fine", S, (lf + lb) / (ff + fbw), 0.0, 0.0, seen});
}

// PyTorch's SDPA in a child process (tools/bench_sdpa.py); empty when PyTorch is not importable.
// The script marks each timed loop ({"timing": "begin"} ... "end"), forward then backward per
// shape, and `clocks` samples between the marks.
std::vector<Result> run_sdpa(const BenchOptions& o, ClockSampler& clocks) {
  std::vector<Result> r;
  const char* env = std::getenv("FVATTN_BENCH_SDPA_SCRIPT");
  const std::string script = env ? env : FVATTN_SOURCE_DIR "/tools/bench_sdpa.py";
  std::string cmd = fmt::format("python3 {} {} {} {}", script, o.B, o.H, o.D);
  for (int64_t s : o.seqs) cmd += fmt::format(" {}", s);
  if (o.settle_s > 0.0) cmd += fmt::format(" --settle {}", o.settle_s);
  cmd += " 2>&1";
  fmt::print(stderr, "bench: PyTorch SDPA ({}) ...\n", cmd);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char line[4096];
  std::string log;
  std::vector<ClockStats> loops;  // the timed loops' clocks since the last shape's line
  while (std::fgets(line, sizeof line, p)) {
    if (std::strncmp(line, "{\"timing\": \"begin\"}", 19) == 0) {
      clocks.start();
      continue;
    }
    if (std::strncmp(line, "{\"timing\": \"end\"}", 17) == 0) {
      loops.push_back(clocks.stop());
      continue;
    }
    long long S = 0;
    double f = 0, b = 0;
    char backend[32] = {0};
    if (std::sscanf(line, "{\"S\": %lld, \"fwd_ms\": %lf, \"bwd_ms\": %lf, \"backend\": \"%31[a-z]\"", &S, &f, &b,
                    backend) == 4) {
      const double dense = 4.0 * o.B * o.H * static_cast<double>(S) * S * o.D;
      const ClockStats none{};
      const ClockStats& fwd_clocks = loops.size() == 2 ? loops[0] : none;
      const ClockStats& bwd_clocks = loops.size() == 2 ? loops[1] : none;
      r.push_back({fmt::format("sdpa_{}_forward", backend), S, f, dense / (f * 1e9), 0.0, fwd_clocks});
      r.push_back({fmt::format("sdpa_{}_backward", backend), S, b, 2.5 * dense / (b * 1e9), 0.0,
                   bwd_clocks});
      loops.clear();
    } else {
      log += line;
    }
  }
  const int rc = pclose(p);
  if (rc != 0 || r.empty())
    fmt::print(stderr, "bench: PyTorch SDPA not measured ({}):\n{}\n", rc, log.substr(0, 2000));
  return r;
}

}  // namespace

int cmd_bench(const BenchOptions& o) {
  const std::string& kernels = o.kernels;
  const int32_t deterministic = o.deterministic;
  fva_handle_info_t info;
  info.struct_size = sizeof info;
  cudaStream_t stream;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::vector<Result> res;
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  ClockSampler clocks(device);
  if (!clocks.valid())
    fmt::print(stderr, "bench: NVML (libnvidia-ml.so.1) unavailable: no SM clock or power per op\n");
  for (const int32_t choice : {FVA_KERNELS_AUTO, FVA_KERNELS_PORTABLE}) {
    if ((choice == FVA_KERNELS_AUTO && kernels == "portable") ||
        (choice == FVA_KERNELS_PORTABLE && kernels == "auto"))
      continue;
    fva_handle_t h = nullptr;
    fva_handle_options_t opts = FVA_HANDLE_OPTIONS_INIT;
    opts.backend = FVA_BACKEND_CUDA;
    opts.kernels = choice;
    opts.deterministic = deterministic;
    fva_check(fva_create(&h, &opts), "fva_create(CUDA)");
    fva_check(fva_get_info(h, &info), "fva_get_info");
    std::mt19937_64 rng(12345);
    const size_t first = res.size();
    if (o.qat || o.vsa)
      for (int64_t S : o.seqs) bench_shape(h, o, S, rng, stream, clocks, res);
    if (!o.layer_grid.empty()) bench_layer(h, o, rng, stream, clocks, res);
    if (kernels == "both" && choice == FVA_KERNELS_PORTABLE)
      for (size_t i = first; i < res.size(); ++i) res[i].op += "/portable";
    fva_destroy(h);
  }
  cudaStreamDestroy(stream);
  if (o.sdpa) {
    const std::vector<Result> s = run_sdpa(o, clocks);
    res.insert(res.end(), s.begin(), s.end());
  }

  fmt::print("fvattn bench on {} (sm_{}{}, image {}), B={} H={} D={}, bf16, median of {} (warm-up {}), "
             "{} handles\n",
             info.device_name, info.sm_major, info.sm_minor, info.image, o.B, o.H, o.D, o.iters,
             o.warmup, deterministic ? "deterministic" : "default (not deterministic)");
  // SM MHz and W: medians of NVML samples over the op's timed calls (the card lowers its clock
  // when it reaches its power limit, so equal kernels can differ by their clocks); W is the
  // board's instantaneous power where the driver reports it (tools/gpu_clocks.h), and the JSON
  // adds its maximum and its source.
  // A clock or power figure, or `missing` where NVML gave none.
  auto whole_or = [](double x, const char* missing) {
    return std::isnan(x) ? std::string(missing) : fmt::format("{:.0f}", x);
  };
  fmt::print("{:<22} {:>7} {:>10} {:>9} {:>7} {:>5}  {}\n", "op", "S", "ms", "TFLOPS", "SM MHz", "W",
             "note");
  for (const Result& r : res) {
    std::string note;
    if (r.op.rfind("qat_forward", 0) == 0) note = fmt::format("executed (2 P·V): {:.1f} TFLOPS", r.tflops_extra);
    if (r.op.rfind("vsa", 0) == 0) note = fmt::format("dense-equivalent: {:.1f} TFLOPS", r.tflops_extra);
    fmt::print("{:<22} {:>7} {:>10.3f} {:>9.1f} {:>7} {:>5}  {}\n", r.op, r.S, r.ms, r.tflops,
               whole_or(r.clocks.sm_mhz_median, "-"), whole_or(r.clocks.watts_median, "-"), note);
  }
  if (!o.json_path.empty()) {
    // Field names are read by tools/device/ab_table.py and docs/perf.md: keep them.
    auto rounded = [](double x, double unit) { return std::round(x / unit) * unit; };
    auto whole = [](double x) -> nlohmann::ordered_json {  // null where NVML gave none
      if (std::isnan(x)) return nullptr;
      return static_cast<int64_t>(std::llround(x));
    };
    nlohmann::ordered_json j;
    j["device"] = info.device_name;
    j["image"] = info.image;
    j["B"] = o.B;
    j["H"] = o.H;
    j["D"] = o.D;
    j["iters"] = o.iters;
    j["deterministic"] = deterministic;
    j["vsa_density"] = o.density;
    j["vsa_lists"] = o.local_lists ? "local" : "random";
    j["settle_s"] = o.settle_s;
    j["layer_grid"] = o.layer_grid;
    j["layer_topk"] = o.layer_grid.empty() ? 0 : o.layer_topk;
    j["results"] = nlohmann::ordered_json::array();
    for (const Result& r : res) {
      nlohmann::ordered_json x;
      x["op"] = r.op;
      x["S"] = r.S;
      x["ms"] = rounded(r.ms, 1e-4);
      x["tflops"] = rounded(r.tflops, 1e-2);
      x["tflops_extra"] = rounded(r.tflops_extra, 1e-2);
      x["sm_mhz_median"] = whole(r.clocks.sm_mhz_median);
      x["sm_mhz_min"] = whole(r.clocks.sm_mhz_min);
      x["power_w_median"] = whole(r.clocks.watts_median);
      x["power_w_max"] = whole(r.clocks.watts_max);
      if (r.clocks.samples == 0)
        x["power_source"] = nullptr;
      else
        x["power_source"] = r.clocks.instant_power ? "instant" : "1s-average";
      x["clock_samples"] = r.clocks.samples;
      j["results"].push_back(std::move(x));
    }
    std::ofstream f(o.json_path);
    f << j.dump(1) << "\n";
    if (!f) {
      fmt::print(stderr, "fvattn bench: cannot write the JSON file {} (check the directory exists and is "
                 "writable)\n", o.json_path);
      return 1;
    }
  }
  return 0;
}

}  // namespace fvtool
