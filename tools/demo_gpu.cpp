// `fvattn demo` on a GPU: QAT attention (FastVideo's production preset), VSA (25% density, last kv
// block ragged) and the whole VSA layer (with gate), forward and backward, at a video-model shape
// (default B=1, H=8, S=16384, D=128), timed with CUDA events, and checked against the independent
// float64 reference (tools/reference64).
//
// A float64 run of the whole problem would take hours, so the check uses slices whose exact result
// does not depend on the rest: attention rows are independent, so o, lse and dQ of a 64-row query
// slice need only that slice against all keys; dK and dV of a 64-key slice need all queries against
// only that slice (with the library's lse and o_hp, as a training step has them). Slices start at
// multiples of 64, so the NVFP4 tiles (32 tokens) are the same ones the full problem uses.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <fvattn/fvattn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "commands.h"
#include "demo_checks.h"
#include "gpu_util.h"
#include "reference64.h"

namespace fvtool {
namespace {

struct Check {
  std::string name;
  double err;
  double bound;
};

double bf16_to_double(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t double_to_bf16(double x) {  // x is a bf16 value already: exact
  const float f = static_cast<float>(x);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

// A full [1, H, S, D] tensor on the host (bf16 bits) and on the device.
struct Full {
  int64_t H, S, D;
  std::vector<uint16_t> host;
  DeviceArray dev;
  Full(int64_t H_, int64_t S_, int64_t D_, std::mt19937_64* rng)
      : H(H_), S(S_), D(D_), host(static_cast<size_t>(H_ * S_ * D_)), dev(host.size() * 2) {
    if (rng) {
      std::normal_distribution<double> n;
      for (auto& x : host) x = double_to_bf16(ref64::round_bf16(n(*rng)));
      dev.upload(host);
    }
  }
  fva_tensor_t t() const { return contiguous(dev.get(), FVA_DTYPE_BF16, {1, H, S, D}); }
  void fetch() { host = dev.download<uint16_t>(host.size()); }
  // Rows [s0, s0 + n) of head h as a float64 reference tensor [1, 1, n, D].
  ref64::Tensor slice(int64_t h, int64_t s0, int64_t n) const {
    ref64::Tensor r(ref64::Shape{1, 1, n, D});
    for (int64_t s = 0; s < n; ++s)
      for (int64_t d = 0; d < D; ++d) r.at(0, 0, s, d) = bf16_to_double(host[static_cast<size_t>((h * S + s0 + s) * D + d)]);
    return r;
  }
};

std::vector<double> lse_slice(const std::vector<float>& lse, int64_t S, int64_t h, int64_t s0, int64_t n) {
  return std::vector<double>(lse.begin() + h * S + s0, lse.begin() + h * S + s0 + n);
}


// Zeros in the last `pad` slots of every head (the padding slots of a ragged last block, which
// FastVideo's tiling leaves zero), on the host and the device.
void zero_tail(Full& x, int64_t pad) {
  for (int64_t h = 0; h < x.H; ++h)
    std::fill(x.host.begin() + (h * x.S + x.S - pad) * x.D, x.host.begin() + (h + 1) * x.S * x.D, 0);
  x.dev.upload(x.host);
}

// The whole VSA layer with gate on [1, H, S, D] inputs (block sizes 64 but the last, 40; topk a
// quarter of the blocks): forward and backward once per call of run(), the outputs in place.
struct LayerRun {
  int64_t H, S, D = 128, nb, topk;
  Full q, k, v, gate, dout, out, dq, dk, dv, dgate;
  std::vector<int32_t> sizes;
  DeviceArray dsizes, didx, dnum, ws, reserve;
  fva_vsa_layer_config_t cfg = FVA_VSA_LAYER_CONFIG_INIT;
  size_t ws_bytes = 0, reserve_bytes = 0;
  LayerRun(fva_handle_t h, int64_t H_, int64_t S_, std::mt19937_64& rng)
      : H(H_), S(S_), nb(S_ / 64), topk(std::max<int64_t>(1, S_ / 64 / 4)), q(H, S, D, &rng),
        k(H, S, D, &rng), v(H, S, D, &rng), gate(H, S, D, &rng), dout(H, S, D, &rng),
        out(H, S, D, nullptr), dq(H, S, D, nullptr), dk(H, S, D, nullptr), dv(H, S, D, nullptr),
        dgate(H, S, D, nullptr), sizes(static_cast<size_t>(nb), 64), dsizes(sizes.size() * 4),
        didx(static_cast<size_t>(H * nb * topk) * 4), dnum(static_cast<size_t>(H * nb) * 4) {
    sizes.back() = 40;
    dsizes.upload(sizes);
    for (Full* x : {&q, &k, &v}) zero_tail(*x, 24);
    cfg.topk = static_cast<int32_t>(topk);
    const fva_tensor_t tq = q.t(), tk = k.t(), tv = v.t();
    fva_check(fva_vsa_layer_sizes(h, &cfg, &tq, &tk, &tv, &ws_bytes, &reserve_bytes), "fva_vsa_layer_sizes");
    ws = DeviceArray(ws_bytes);
    reserve = DeviceArray(reserve_bytes);
  }
  void run(fva_handle_t h, cudaStream_t stream) {
    const fva_tensor_t tq = q.t(), tk = k.t(), tv = v.t(), tg = gate.t(), tdo = dout.t(), to = out.t(),
                       tdq = dq.t(), tdk = dk.t(), tdv = dv.t(), tdg = dgate.t();
    const fva_tensor_t ts = contiguous(dsizes.get(), FVA_DTYPE_I32, {nb});
    const fva_tensor_t ti = contiguous(didx.get(), FVA_DTYPE_I32, {1, H, nb, topk});
    const fva_tensor_t tn = contiguous(dnum.get(), FVA_DTYPE_I32, {1, H, nb});
    fva_check(fva_vsa_layer_forward(h, &cfg, &tq, &tk, &tv, &tg, &ts, &ts, &to, &ti, &tn, reserve.get(),
                                    reserve_bytes, ws.get(), ws_bytes, stream),
              "fva_vsa_layer_forward");
    fva_check(fva_vsa_layer_backward(h, &cfg, &tq, &tk, &tv, &tg, &ts, &ts, &tdo, reserve.get(),
                                     reserve_bytes, &tdq, &tdk, &tdv, &tdg, ws.get(), ws_bytes, stream),
              "fva_vsa_layer_backward");
  }
};

// A whole [1, H, S, D] tensor as a float64 reference tensor.
ref64::Tensor whole(const Full& x) {
  ref64::Tensor r(ref64::Shape{1, x.H, x.S, x.D});
  for (size_t i = 0; i < x.host.size(); ++i) r.data[i] = bf16_to_double(x.host[i]);
  return r;
}

}  // namespace

int demo_gpu(fva_handle_t h, int64_t H, int64_t S, uint64_t seed, int runs) {
  const int64_t D = 128, nb = S / 64;
  std::mt19937_64 rng(seed);
  fva_handle_info_t info;
  info.struct_size = sizeof info;
  fva_check(fva_get_info(h, &info), "fva_get_info");
  fmt::print("fvattn {}.{}.{} demo on {} (sm_{}{}, image {}): B=1 H={} S={} D={}, bf16, seed {}\n",
             FVA_VERSION_MAJOR, FVA_VERSION_MINOR, FVA_VERSION_PATCH, info.device_name,
             info.sm_major, info.sm_minor, info.image, H, S, D, seed);
  fmt::print("QAT: FastVideo production preset (NVFP4 block scales, high-precision o); VSA: 25% of kv "
             "blocks per q block, last block 40 tokens; VSA layer: the whole video_sparse_attn with\n"
             "gate, top-k a quarter of the blocks (its TFLOPS count the fine branch)\n");
  Full q(H, S, D, &rng), k(H, S, D, &rng), v(H, S, D, &rng), dout(H, S, D, &rng);
  Full o(H, S, D, nullptr), o_hp(H, S, D, nullptr), dq(H, S, D, nullptr), dk(H, S, D, nullptr), dv(H, S, D, nullptr);
  DeviceArray lse_dev(static_cast<size_t>(H * S) * 4);
  const fva_tensor_t tl = contiguous(lse_dev.get(), FVA_DTYPE_F32, {1, H, S});
  const fva_tensor_t tq = q.t(), tk = k.t(), tv = v.t(), tdo = dout.t(), to = o.t(), toh = o_hp.t(),
                     tdq = dq.t(), tdk = dk.t(), tdv = dv.t();
  const double dense = 4.0 * H * static_cast<double>(S) * S * D;
  cudaStream_t stream = nullptr;
  std::vector<Check> checks;
  struct Timing {
    std::string op;
    double ms, tflops;
  };
  std::vector<Timing> times;
  // Slices checked: one random 64-row query slice and one 64-key slice of a random head.
  const int64_t head = std::uniform_int_distribution<int64_t>(0, H - 1)(rng);
  const int64_t qs0 = 64 * std::uniform_int_distribution<int64_t>(0, nb - 1)(rng);
  const int64_t ks0 = 64 * std::uniform_int_distribution<int64_t>(0, nb - 1)(rng);

  // ---- QAT ----
  const fva_qat_config_t cfg = FVA_QAT_CONFIG_INIT;
  size_t fb = 0, bb = 0;
  fva_check(fva_qat_forward_workspace_size(h, &cfg, &tq, &tk, &tv, &fb), "workspace");
  fva_check(fva_qat_backward_workspace_size(h, &cfg, &tq, &tk, &tv, &bb), "workspace");
  DeviceArray ws(std::max(fb, bb));
  fmt::print(stderr, "demo: QAT forward and backward on the GPU ...\n");
  double ms = median_ms(stream, 1, runs, [&](int) {
    fva_check(fva_qat_forward(h, &cfg, &tq, &tk, &tv, &to, &toh, &tl, ws.get(), fb, stream), "fva_qat_forward");
  });
  times.push_back({"qat forward", ms, dense / (ms * 1e9)});
  ms = median_ms(stream, 1, runs, [&](int) {
    fva_check(fva_qat_backward(h, &cfg, &tq, &tk, &tv, &toh, &tl, &tdo, &tdq, &tdk, &tdv, ws.get(), bb, stream),
              "fva_qat_backward");
  });
  times.push_back({"qat backward", ms, 2.5 * dense / (ms * 1e9)});
  cuda_check(cudaDeviceSynchronize(), "QAT");
  for (Full* f : {&o, &o_hp, &dq, &dk, &dv}) f->fetch();
  std::vector<float> lse = lse_dev.download<float>(static_cast<size_t>(H * S));
  {
    fmt::print(stderr, "demo: float64 reference of the QAT slices ...\n");
    ref64::QatConfig rc;
    const ref64::Tensor kh = k.slice(head, 0, S), vh = v.slice(head, 0, S), qs = q.slice(head, qs0, 64);
    const ref64::QatForward rf = ref64::qat_forward(rc, ref64::DType::BF16, qs, kh, vh);
    checks.push_back({"qat o", rel_l2(o.slice(head, qs0, 64).data, rf.o.data), 1e-2});
    checks.push_back({"qat o_hp", rel_l2(o_hp.slice(head, qs0, 64).data, rf.o_hp.data), 1e-2});
    checks.push_back({"qat lse", rel_l2(lse_slice(lse, S, head, qs0, 64), rf.lse), 1e-3});
    const ref64::Grads gq = ref64::qat_backward(rc, ref64::DType::BF16, qs, kh, vh, o_hp.slice(head, qs0, 64),
                                                lse_slice(lse, S, head, qs0, 64), dout.slice(head, qs0, 64));
    checks.push_back({"qat dq", rel_l2(dq.slice(head, qs0, 64).data, gq.dq.data), 1e-2});
    const ref64::Grads gk = ref64::qat_backward(rc, ref64::DType::BF16, q.slice(head, 0, S), k.slice(head, ks0, 64),
                                                v.slice(head, ks0, 64), o_hp.slice(head, 0, S),
                                                lse_slice(lse, S, head, 0, S), dout.slice(head, 0, S));
    checks.push_back({"qat dk", rel_l2(dk.slice(head, ks0, 64).data, gk.dk.data), 1e-2});
    checks.push_back({"qat dv", rel_l2(dv.slice(head, ks0, 64).data, gk.dv.data), 1e-2});
  }

  // ---- VSA ----
  const int64_t topk = std::max<int64_t>(1, nb / 4);
  std::vector<int32_t> idx(static_cast<size_t>(H * nb * topk)), all(static_cast<size_t>(nb));
  for (int64_t i = 0; i < nb; ++i) all[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  for (int64_t r = 0; r < H * nb; ++r) {
    std::shuffle(all.begin(), all.end(), rng);
    std::sort(all.begin(), all.begin() + topk);
    std::copy(all.begin(), all.begin() + topk, idx.begin() + r * topk);
  }
  std::vector<int32_t> num(static_cast<size_t>(H * nb), static_cast<int32_t>(topk)), sizes(static_cast<size_t>(nb), 64);
  sizes.back() = 40;
  DeviceArray didx(idx.size() * 4), dnum(num.size() * 4), dsz(sizes.size() * 4);
  didx.upload(idx);
  dnum.upload(num);
  dsz.upload(sizes);
  const fva_tensor_t ti = contiguous(didx.get(), FVA_DTYPE_I32, {1, H, nb, topk});
  const fva_tensor_t tn = contiguous(dnum.get(), FVA_DTYPE_I32, {1, H, nb});
  const fva_tensor_t ts = contiguous(dsz.get(), FVA_DTYPE_I32, {nb});
  const fva_vsa_config_t vcfg = FVA_VSA_CONFIG_INIT;
  size_t vb = 0, vfb = 0;  // one workspace serves the forward and the backward
  fva_check(fva_vsa_forward_workspace_size(h, &vcfg, &tq, &tk, &tv, &ti, &vfb), "workspace");
  fva_check(fva_vsa_backward_workspace_size(h, &vcfg, &tq, &tk, &tv, &ti, &vb), "workspace");
  vb = std::max(vb, vfb);
  DeviceArray vws(vb);
  const double sparse = 4.0 * H * D * 64.0 * 64.0 * static_cast<double>(nb * topk);
  fmt::print(stderr, "demo: VSA forward and backward on the GPU ...\n");
  ms = median_ms(stream, 1, runs, [&](int) {
    fva_check(fva_vsa_forward(h, &vcfg, &tq, &tk, &tv, &ti, &tn, &ts, &to, &tl, vws.get(), vb, stream),
              "fva_vsa_forward");
  });
  times.push_back({"vsa forward", ms, sparse / (ms * 1e9)});
  ms = median_ms(stream, 1, runs, [&](int) {
    fva_check(fva_vsa_backward(h, &vcfg, &tq, &tk, &tv, &to, &tl, &tdo, &ti, &tn, &ts, &tdq, &tdk, &tdv,
                               vws.get(), vb, stream),
              "fva_vsa_backward");
  });
  times.push_back({"vsa backward", ms, 2.5 * sparse / (ms * 1e9)});
  cuda_check(cudaDeviceSynchronize(), "VSA");
  for (Full* f : {&o, &dq, &dk, &dv}) f->fetch();
  lse = lse_dev.download<float>(static_cast<size_t>(H * S));
  {
    fmt::print(stderr, "demo: float64 reference of the VSA slices ...\n");
    const ref64::VsaConfig rc;
    const int64_t qb = qs0 / 64, kb = ks0 / 64;
    // q block qb against its own list (all kv blocks of the head).
    ref64::VsaIndex one;
    one.B = one.H = one.num_q_blocks = 1;
    one.max_k = topk;
    one.q2k_idx.assign(idx.begin() + (head * nb + qb) * topk, idx.begin() + (head * nb + qb + 1) * topk);
    one.q2k_num = {static_cast<int32_t>(topk)};
    one.block_sizes = sizes;
    const ref64::Tensor qs = q.slice(head, qs0, 64), kh = k.slice(head, 0, S), vh = v.slice(head, 0, S);
    const ref64::VsaForward rf = ref64::vsa_forward(rc, ref64::DType::BF16, qs, kh, vh, one);
    checks.push_back({"vsa o", rel_l2(o.slice(head, qs0, 64).data, rf.o.data), 1e-2});
    checks.push_back({"vsa lse", rel_l2(lse_slice(lse, S, head, qs0, 64), rf.lse), 1e-3});
    const ref64::Grads gq = ref64::vsa_backward(rc, ref64::DType::BF16, qs, kh, vh, o.slice(head, qs0, 64),
                                                lse_slice(lse, S, head, qs0, 64), dout.slice(head, qs0, 64), one);
    checks.push_back({"vsa dq", rel_l2(dq.slice(head, qs0, 64).data, gq.dq.data), 1e-2});
    // kv block kb against every q block of the head: a one-block problem where q block r lists it
    // iff it did in the real lists.
    ref64::VsaIndex col;
    col.B = col.H = 1;
    col.num_q_blocks = nb;
    col.max_k = 1;
    for (int64_t r = 0; r < nb; ++r) {
      const auto b0 = idx.begin() + (head * nb + r) * topk;
      const bool listed = std::find(b0, b0 + topk, static_cast<int32_t>(kb)) != b0 + topk;
      col.q2k_idx.push_back(0);
      col.q2k_num.push_back(listed ? 1 : 0);
    }
    col.block_sizes = {sizes[static_cast<size_t>(kb)]};
    const ref64::Grads gk = ref64::vsa_backward(rc, ref64::DType::BF16, q.slice(head, 0, S), k.slice(head, ks0, 64),
                                                v.slice(head, ks0, 64), o.slice(head, 0, S),
                                                lse_slice(lse, S, head, 0, S), dout.slice(head, 0, S), col);
    checks.push_back({"vsa dk", rel_l2(dk.slice(head, ks0, 64).data, gk.dk.data), 1e-2});
    checks.push_back({"vsa dv", rel_l2(dv.slice(head, ks0, 64).data, gk.dv.data), 1e-2});
  }

  // ---- the whole VSA layer ----
  // Timed at the demo's shape; checked on a second, small problem (H = 2, S = 1024) against the
  // float64 reference of the whole layer, whose fine branch at the demo's shape would take minutes.
  {
    fmt::print(stderr, "demo: the whole VSA layer on the GPU ...\n");
    LayerRun big(h, H, S, rng);
    ms = median_ms(stream, 1, runs, [&](int) { big.run(h, stream); });
    const double fine = 3.5 * 4.0 * H * D * 64.0 * 64.0 * static_cast<double>(nb * big.topk);
    times.push_back({"vsa layer f+b", ms, fine / (ms * 1e9)});
    LayerRun small(h, 2, 1024, rng);
    small.run(h, stream);
    cuda_check(cudaDeviceSynchronize(), "VSA layer");
    for (Full* f : {&small.out, &small.dq, &small.dk, &small.dv, &small.dgate}) f->fetch();
    fmt::print(stderr, "demo: float64 reference of the small VSA layer ...\n");
    const ref64::VsaLayerInputs in{whole(small.q), whole(small.k), whole(small.v), whole(small.gate),
                                   true, small.sizes, small.sizes};
    // The lists must be a selection SPEC 3b allows for the reference's own scores: "lists" is 0 then.
    for (const auto& [name, err] : layer_reference_errors(
             in, whole(small.dout), small.topk,
             small.didx.download<int32_t>(static_cast<size_t>(small.H * small.nb * small.topk)),
             small.dnum.download<int32_t>(static_cast<size_t>(small.H * small.nb)),
             whole(small.out).data, whole(small.dq).data, whole(small.dk).data, whole(small.dv).data,
             whole(small.dgate).data))
      checks.push_back({"layer " + name, err, name == "lists" ? 0.0 : 1e-2});
  }

  fmt::print("\n{:<14} {:>10} {:>9}\n", "op", "time ms", "TFLOPS");
  for (const Timing& t : times) fmt::print("{:<14} {:>10.3f} {:>9.1f}\n", t.op, t.ms, t.tflops);
  fmt::print("\nchecks against float64 (head {}, query rows {}..{}, keys {}..{}):\n", head, qs0, qs0 + 63, ks0, ks0 + 63);
  bool ok = true;
  for (const Check& c : checks) {
    const bool pass = c.err <= c.bound;
    ok = ok && pass;
    fmt::print("  {:<10} rel L2 {:.2e} (bound {:.0e})  {}\n", c.name, c.err, c.bound, pass ? "PASS" : "FAIL");
  }
  fmt::print("\ntimes: CUDA events, median of {} run(s) after a warm-up; FLOPs by ARCHITECTURE.md's "
             "conventions (backward = 2.5x forward; VSA counts selected blocks). `fvattn bench` "
             "compares with PyTorch SDPA.\n",
             runs);
  return ok ? 0 : 1;
}

}  // namespace fvtool
