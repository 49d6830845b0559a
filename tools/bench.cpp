// `fvattn bench`: forward and backward TFLOPS of QAT attention (FastVideo's production preset) and
// VSA (25% density) on the GPU, over a list of sequence lengths or a suite of shapes (--suite), with
// PyTorch's cuDNN SDPA (dense) timed at each shape in the same run when PyTorch is importable, and
// each op's ratio to it. Timing follows docs/perf.md's method:
// CUDA events around each call, warm-up first, the median of the timed calls, input sets rotated so
// that they never sit in L2 between calls. Progress on stderr, the table on stdout, --json for
// machines.
//
// FLOPs (docs/perf.md): attention forward 4·B·H·Sq·Skv·D (causal: the visible pairs, S(S+1)/2, for
// Sq·Skv), backward 2.5x ("algorithmic", what every comparison uses); QAT also reports what its forward executes (6·B·H·S²·D: two P·V products); VSA
// counts only selected blocks (4·B·H·D·64·64·Σ q2k_num) and reports the dense-equivalent rate too.
#include <cuda_fp16.h>
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
  int shape = -1;       // index into the run's shapes (-1: the layer's rows)
  double vs_sdpa = std::nan("");  // tflops over SDPA's at the same shape and direction
};

// One shape of a run: B x Hq query heads over Hkv kv heads (Hkv < Hq: grouped-query attention).
struct BenchShape {
  int64_t B = 1, Hq = 8, Hkv = 8, S = 16384, D = 128;
  int32_t dtype = FVA_DTYPE_BF16;
  bool causal = false;  // QAT only
  bool qat = true, vsa = true;
  double density = 0.25;  // VSA: the fraction of kv blocks each q block lists ...
  int64_t topk = 0;       // ... or, when > 0, this many
  std::string label() const {
    return fmt::format("B{} H{}{} S{} D{}{}{}", B, Hq, Hkv != Hq ? fmt::format(":{}", Hkv) : "", S, D,
                       dtype == FVA_DTYPE_F16 ? " f16" : "", causal ? " causal" : "");
  }
  // Query-key pairs attention computes (the visible ones when causal; Sq = Skv = S).
  double pairs() const {
    return causal ? 0.5 * static_cast<double>(S) * static_cast<double>(S + 1) : static_cast<double>(S) * S;
  }
};

// The run's shapes: --suite round2's list, or --seq over --batch, --heads, --dim.
std::vector<BenchShape> bench_shapes(const BenchOptions& o) {
  std::vector<BenchShape> shapes;
  auto add = [&](BenchShape s) {
    s.qat = s.qat && o.qat;
    s.vsa = s.vsa && o.vsa && !s.causal && s.S % 64 == 0;
    if (s.qat || s.vsa) shapes.push_back(s);
  };
  if (o.suite == "round2") {
    BenchShape base;  // B=1 H=8 S=16384 D=128 bf16, QAT and VSA at 25%
    add(base);
    BenchShape s = base;
    s.S = 4096;
    add(s);
    s = base;  // ThunderKittens' own VSA point
    s.Hq = s.Hkv = 12, s.S = 49152, s.topk = 76, s.qat = false;
    add(s);
    s = base;
    s.Hq = s.Hkv = 16, s.D = 64;
    add(s);
    s = base;
    s.causal = true;
    add(s);
    s = base;
    s.B = 2;
    add(s);
    s = base;
    s.Hkv = 2;
    add(s);
    s = base;
    s.dtype = FVA_DTYPE_F16;
    add(s);
    s = base;  // Wan2.1-14B's attention: 32760 tokens, not a multiple of 64 (QAT only)
    s.Hq = s.Hkv = 40, s.S = 32760, s.vsa = false;
    add(s);
  } else {
    for (int64_t S : o.seqs) {
      BenchShape s;
      s.B = o.B, s.Hq = s.Hkv = o.H, s.S = S, s.D = o.D, s.density = o.density;
      add(s);
    }
  }
  return shapes;
}

// n random normal values as bf16 or f16 bits.
std::vector<uint16_t> random_halves(size_t n, int32_t dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> d;
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    const float f = d(rng);
    if (dtype == FVA_DTYPE_F16) {
      x = __half_as_ushort(__float2half_rn(f));
    } else {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      x = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
  return v;
}
std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng) { return random_halves(n, FVA_DTYPE_BF16, rng); }

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

AttnSet make_set(const BenchShape& sh, std::mt19937_64& rng) {
  const size_t nq = static_cast<size_t>(sh.B * sh.Hq * sh.S * sh.D), nkv = static_cast<size_t>(sh.B * sh.Hkv * sh.S * sh.D);
  AttnSet s{DeviceArray(nq * 2),  DeviceArray(nkv * 2), DeviceArray(nkv * 2),
            DeviceArray(nq * 2),  DeviceArray(nq * 2),  DeviceArray(static_cast<size_t>(sh.B * sh.Hq * sh.S) * 4),
            DeviceArray(nq * 2),  DeviceArray(nq * 2),  DeviceArray(nkv * 2), DeviceArray(nkv * 2)};
  s.q.upload(random_halves(nq, sh.dtype, rng));
  s.k.upload(random_halves(nkv, sh.dtype, rng));
  s.v.upload(random_halves(nkv, sh.dtype, rng));
  s.dout.upload(random_halves(nq, sh.dtype, rng));
  return s;
}

void bench_shape(fva_handle_t h, const BenchOptions& o, const BenchShape& sh, int index, std::mt19937_64& rng,
                 cudaStream_t stream, ClockSampler& clocks, std::vector<Result>& out) {
  ClockStats seen;
  auto timed = [&](const std::function<void(int)>& fn) {
    settle(o, stream);
    return median_ms(stream, o.warmup, o.iters, fn, 4000.0, &clocks, &seen);
  };
  const int64_t B = sh.B, Hq = sh.Hq, Hkv = sh.Hkv, S = sh.S, D = sh.D;
  const int sets = rotation_sets(static_cast<size_t>(2 * B * S * D * (2 * Hq + 2 * Hkv)));
  std::vector<AttnSet> a;
  for (int i = 0; i < sets; ++i) a.push_back(make_set(sh, rng));
  // q-shaped (q, o, dout, dq) and kv-shaped (k, v, dk, dv) tensors, and the lse.
  auto t4 = [&](const DeviceArray& d) { return contiguous(d.get(), sh.dtype, {B, Hq, S, D}); };
  auto tkv = [&](const DeviceArray& d) { return contiguous(d.get(), sh.dtype, {B, Hkv, S, D}); };
  auto t3 = [&](const DeviceArray& d) { return contiguous(d.get(), FVA_DTYPE_F32, {B, Hq, S}); };
  const double dense = 4.0 * B * Hq * sh.pairs() * D;
  auto record = [&](const std::string& op, double ms, double tflops, double extra) {
    Result r{op, S, ms, tflops, extra, seen};
    r.shape = index;
    out.push_back(r);
  };

  double ms = 0.0;
  if (sh.qat) {  // ---- QAT: the production preset, or plain attention (quantize = 0) ----
    fva_qat_config_t cfg = FVA_QAT_CONFIG_INIT;
    if (o.plain) cfg.quantize = 0;
    cfg.causal = sh.causal ? 1 : 0;
    const std::string fwd_op = o.plain ? "plain_forward" : "qat_forward";
    const std::string bwd_op = o.plain ? "plain_backward" : "qat_backward";
    size_t fb = 0, bb = 0;
    {
      const fva_tensor_t q = t4(a[0].q), k = tkv(a[0].k), v = tkv(a[0].v);
      fva_check(fva_qat_forward_workspace_size(h, &cfg, &q, &k, &v, &fb), "qat workspace");
      fva_check(fva_qat_backward_workspace_size(h, &cfg, &q, &k, &v, &bb), "qat workspace");
    }
    DeviceArray ws(std::max(fb, bb));
    auto qat_fwd = [&](int i) {
      const AttnSet& s = a[static_cast<size_t>(i % sets)];
      const fva_tensor_t q = t4(s.q), k = tkv(s.k), v = tkv(s.v), oo = t4(s.o), oh = t4(s.o_hp), l = t3(s.lse);
      fva_check(fva_qat_forward(h, &cfg, &q, &k, &v, &oo, &oh, &l, ws.get(), fb, stream), "fva_qat_forward");
    };
    fmt::print(stderr, "bench {}: {} ...\n", sh.label(), fwd_op);
    ms = timed(qat_fwd);
    // Executed: the quantized forward runs both P·V products (1.5x the algorithmic FLOPs).
    record(fwd_op, ms, dense / (ms * 1e9), o.plain ? 0.0 : 1.5 * dense / (ms * 1e9));
    for (int i = 0; i < sets; ++i) qat_fwd(i);  // o_hp and lse for the backward
    auto qat_bwd = [&](int i) {
      const AttnSet& s = a[static_cast<size_t>(i % sets)];
      const fva_tensor_t q = t4(s.q), k = tkv(s.k), v = tkv(s.v), oh = t4(s.o_hp), l = t3(s.lse),
                         d = t4(s.dout), gq = t4(s.dq), gk = tkv(s.dk), gv = tkv(s.dv);
      fva_check(fva_qat_backward(h, &cfg, &q, &k, &v, &oh, &l, &d, &gq, &gk, &gv, ws.get(), bb, stream),
                "fva_qat_backward");
    };
    fmt::print(stderr, "bench {}: {} ...\n", sh.label(), bwd_op);
    ms = timed(qat_bwd);
    record(bwd_op, ms, 2.5 * dense / (ms * 1e9), 0.0);
  }
  if (!sh.vsa) return;

  // ---- VSA at the shape's density: each q block lists top-k = nblocks * density kv blocks ----
  const int64_t nb = S / 64;
  const int64_t topk = sh.topk > 0 ? std::min(sh.topk, nb) : std::max<int64_t>(1, static_cast<int64_t>(nb * sh.density));
  const std::vector<int32_t> idx = vsa_lists(B * Hq, nb, topk, o.local_lists, rng);
  const std::vector<int32_t> num(static_cast<size_t>(B * Hq * nb), static_cast<int32_t>(topk));
  DeviceArray didx(idx.size() * 4), dnum(num.size() * 4), dsizes(static_cast<size_t>(nb) * 4);
  didx.upload(idx);
  dnum.upload(num);
  dsizes.upload(std::vector<int32_t>(static_cast<size_t>(nb), 64));
  const fva_tensor_t ti = contiguous(didx.get(), FVA_DTYPE_I32, {B, Hq, nb, topk});
  const fva_tensor_t tn = contiguous(dnum.get(), FVA_DTYPE_I32, {B, Hq, nb});
  const fva_tensor_t ts = contiguous(dsizes.get(), FVA_DTYPE_I32, {nb});
  const fva_vsa_config_t vcfg = FVA_VSA_CONFIG_INIT;
  size_t vb = 0, vfb = 0;  // one workspace serves the forward and the backward
  {
    const fva_tensor_t q = t4(a[0].q), k = tkv(a[0].k), v = tkv(a[0].v);
    fva_check(fva_vsa_forward_workspace_size(h, &vcfg, &q, &k, &v, &ti, &vfb), "vsa workspace");
    fva_check(fva_vsa_backward_workspace_size(h, &vcfg, &q, &k, &v, &ti, &vb), "vsa workspace");
  }
  vb = std::max(vb, vfb);
  DeviceArray vws(vb);
  const double sparse = 4.0 * B * Hq * D * 64.0 * 64.0 * static_cast<double>(nb * topk);
  const double density = static_cast<double>(topk) / static_cast<double>(nb);
  auto vsa_fwd = [&](int i) {
    const AttnSet& s = a[static_cast<size_t>(i % sets)];
    const fva_tensor_t q = t4(s.q), k = tkv(s.k), v = tkv(s.v), oo = t4(s.o), l = t3(s.lse);
    fva_check(fva_vsa_forward(h, &vcfg, &q, &k, &v, &ti, &tn, &ts, &oo, &l, vws.get(), vb, stream),
              "fva_vsa_forward");
  };
  fmt::print(stderr,
             "bench {}: VSA forward (top-k {} of {} blocks, {} lists: 4 neighbours' union {:.0f}% "
             "of their sum) ...\n",
             sh.label(), topk, nb, o.local_lists ? "local" : "random",
             100.0 * union_ratio(idx, B * Hq, nb, topk));
  ms = timed(vsa_fwd);
  record("vsa_forward", ms, sparse / (ms * 1e9), sparse / density / (ms * 1e9));
  for (int i = 0; i < sets; ++i) vsa_fwd(i);
  auto vsa_bwd = [&](int i) {
    const AttnSet& s = a[static_cast<size_t>(i % sets)];
    const fva_tensor_t q = t4(s.q), k = tkv(s.k), v = tkv(s.v), oo = t4(s.o), l = t3(s.lse),
                       d = t4(s.dout), gq = t4(s.dq), gk = tkv(s.dk), gv = tkv(s.dv);
    fva_check(fva_vsa_backward(h, &vcfg, &q, &k, &v, &oo, &l, &d, &ti, &tn, &ts, &gq, &gk, &gv,
                               vws.get(), vb, stream),
              "fva_vsa_backward");
  };
  fmt::print(stderr, "bench {}: VSA backward ...\n", sh.label());
  ms = timed(vsa_bwd);
  record("vsa_backward", ms, 2.5 * sparse / (ms * 1e9), 2.5 * sparse / density / (ms * 1e9));
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

// PyTorch's SDPA in a child process (tools/bench_sdpa.py) at each of the run's shapes; empty when
// PyTorch is not importable. The script marks each timed loop ({"timing": "begin"} ... "end"),
// forward then backward per shape, and `clocks` samples between the marks.
std::vector<Result> run_sdpa(const BenchOptions& o, const std::vector<BenchShape>& shapes, ClockSampler& clocks) {
  std::vector<Result> r;
  const char* env = std::getenv("FVATTN_BENCH_SDPA_SCRIPT");
  const std::string script = env ? env : FVATTN_SOURCE_DIR "/tools/bench_sdpa.py";
  std::string cmd = fmt::format("python3 {}", script);
  for (const BenchShape& sh : shapes)
    cmd += fmt::format(" --shape {},{},{},{},{},{},{}", sh.B, sh.Hq, sh.Hkv, sh.S, sh.D,
                       sh.dtype == FVA_DTYPE_F16 ? "f16" : "bf16", sh.causal ? 1 : 0);
  if (o.settle_s > 0.0) cmd += fmt::format(" --settle {}", o.settle_s);
  cmd += " 2>&1";
  fmt::print(stderr, "bench: PyTorch SDPA ({}) ...\n", cmd);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char line[4096];
  std::string log;
  std::vector<ClockStats> loops;  // the timed loops' clocks since the last shape's line
  while (std::fgets(line, sizeof line, p)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("timing")) {
      if (j["timing"] == "begin") clocks.start();
      else loops.push_back(clocks.stop());
      continue;
    }
    if (!j.is_object() || !j.contains("shape") || !j["shape"].is_number_integer()) {
      log += line;
      continue;
    }
    const int index = j["shape"].get<int>();
    if (index < 0 || index >= static_cast<int>(shapes.size())) {
      log += line;
      continue;
    }
    const BenchShape& sh = shapes[static_cast<size_t>(index)];
    const double f = j.value("fwd_ms", 0.0), b = j.value("bwd_ms", 0.0);
    const std::string backend = j.value("backend", std::string("unknown"));
    const double dense = 4.0 * sh.B * sh.Hq * sh.pairs() * sh.D;
    const ClockStats none{};
    Result fr{fmt::format("sdpa_{}_forward", backend), sh.S, f, dense / (f * 1e9), 0.0,
              loops.size() == 2 ? loops[0] : none};
    Result br{fmt::format("sdpa_{}_backward", backend), sh.S, b, 2.5 * dense / (b * 1e9), 0.0,
              loops.size() == 2 ? loops[1] : none};
    fr.shape = br.shape = index;
    r.push_back(fr);
    r.push_back(br);
    loops.clear();
  }
  const int rc = pclose(p);
  if (rc != 0 || r.empty())
    fmt::print(stderr, "bench: PyTorch SDPA not measured ({}):\n{}\n", rc, log.substr(0, 2000));
  return r;
}

// Each fvattn row's TFLOPS over SDPA's at its shape and direction (forward or backward).
void ratios_to_sdpa(std::vector<Result>& res) {
  auto direction = [](const std::string& op) {
    const size_t slash = op.find('/');
    const std::string base = op.substr(0, slash);
    if (base.size() >= 8 && base.compare(base.size() - 8, 8, "_forward") == 0) return 1;
    if (base.size() >= 9 && base.compare(base.size() - 9, 9, "_backward") == 0) return 2;
    return 0;
  };
  for (Result& r : res) {
    if (r.shape < 0 || r.op.rfind("sdpa_", 0) == 0 || direction(r.op) == 0) continue;
    for (const Result& s : res)
      if (s.shape == r.shape && s.op.rfind("sdpa_", 0) == 0 && direction(s.op) == direction(r.op) && s.tflops > 0)
        r.vs_sdpa = r.tflops / s.tflops;
  }
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
  const std::vector<BenchShape> shapes = bench_shapes(o);
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
    opts.ds_budget_mib = o.ds_budget_mib;  // -1 (FVA_OPTION_AUTO): the library's default
    fva_check(fva_create(&h, &opts), "fva_create(CUDA)");
    fva_check(fva_get_info(h, &info), "fva_get_info");
    std::mt19937_64 rng(12345);
    const size_t first = res.size();
    for (size_t i = 0; i < shapes.size(); ++i)
      bench_shape(h, o, shapes[i], static_cast<int>(i), rng, stream, clocks, res);
    if (!o.layer_grid.empty()) bench_layer(h, o, rng, stream, clocks, res);
    if (kernels == "both" && choice == FVA_KERNELS_PORTABLE)
      for (size_t i = first; i < res.size(); ++i) res[i].op += "/portable";
    fva_destroy(h);
  }
  cudaStreamDestroy(stream);
  if (o.sdpa && !shapes.empty()) {
    const std::vector<Result> s = run_sdpa(o, shapes, clocks);
    res.insert(res.end(), s.begin(), s.end());
  }
  ratios_to_sdpa(res);

  fmt::print("fvattn bench on {} (sm_{}{}, image {}), {}, median of {} (warm-up {}), {}, "
             "{} handles{}\n",
             info.device_name, info.sm_major, info.sm_minor, info.image,
             o.suite.empty() ? fmt::format("B={} H={} D={} bf16", o.B, o.H, o.D) : "suite " + o.suite,
             o.iters, o.warmup,
             o.settle_s > 0 ? fmt::format("{} s of rest before each op", o.settle_s) : std::string("back to back"),
             deterministic ? "deterministic" : "default (not deterministic)",
             o.ds_budget_mib >= 0 ? fmt::format(", stored dS within {} MiB", o.ds_budget_mib) : std::string());
  // SM MHz and W: medians of NVML samples over the op's timed calls (the card lowers its clock
  // when it reaches its power limit, so equal kernels can differ by their clocks); W is the
  // board's instantaneous power where the driver reports it (tools/gpu_clocks.h), and the JSON
  // adds its maximum and its source.
  // A clock or power figure, or `missing` where NVML gave none.
  auto whole_or = [](double x, const char* missing) {
    return std::isnan(x) ? std::string(missing) : fmt::format("{:.0f}", x);
  };
  // vs cuDNN: the row's TFLOPS over SDPA's at the same shape and direction.
  auto shape_of = [&](const Result& r) {
    return r.shape >= 0 ? shapes[static_cast<size_t>(r.shape)].label() : fmt::format("S{}", r.S);
  };
  fmt::print("{:<22} {:<26} {:>9} {:>8} {:>9} {:>7} {:>5}  {}\n", "op", "shape", "ms", "TFLOPS", "vs cuDNN",
             "SM MHz", "W", "note");
  for (const Result& r : res) {
    std::string note;
    if (r.op.rfind("qat_forward", 0) == 0) note = fmt::format("executed (2 P·V): {:.1f} TFLOPS", r.tflops_extra);
    if (r.op.rfind("vsa", 0) == 0) note = fmt::format("dense-equivalent: {:.1f} TFLOPS", r.tflops_extra);
    const std::string vs = std::isnan(r.vs_sdpa) ? std::string("-") : fmt::format("{:.3f}x", r.vs_sdpa);
    fmt::print("{:<22} {:<26} {:>9.3f} {:>8.1f} {:>9} {:>7} {:>5}  {}\n", r.op, shape_of(r), r.ms, r.tflops, vs,
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
    if (o.ds_budget_mib >= 0) j["ds_budget_mib"] = o.ds_budget_mib;
    j["vsa_density"] = o.density;
    j["vsa_lists"] = o.local_lists ? "local" : "random";
    j["settle_s"] = o.settle_s;
    j["layer_grid"] = o.layer_grid;
    j["layer_topk"] = o.layer_grid.empty() ? 0 : o.layer_topk;
    j["suite"] = o.suite;
    j["results"] = nlohmann::ordered_json::array();
    for (const Result& r : res) {
      nlohmann::ordered_json x;
      x["op"] = r.op;
      x["S"] = r.S;
      x["shape"] = shape_of(r);
      if (std::isnan(r.vs_sdpa))
        x["vs_sdpa"] = nullptr;
      else
        x["vs_sdpa"] = rounded(r.vs_sdpa, 1e-4);
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
