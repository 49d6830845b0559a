// The fvattn command line.
//   fvattn info   what this library is and what it runs on (version, ABI, backend, device or why none,
//                 the dispatch table)
//   fvattn demo   the main job: QAT and VSA attention forward and backward, checked against the
//                 independent float64 reference (tools/reference64), timed, printed as a table; on the
//                 GPU when there is one (tools/demo_gpu.cpp), else on the CPU reference backend
//   fvattn bench  GPU TFLOPS over shapes, with PyTorch SDPA alongside (tools/bench.cpp)
//   fvattn soak   random calls of every op for N minutes from several threads on one CUDA handle,
//                 a sample checked against the CPU backend (tools/soak.cpp; --backend cpu: on a
//                 second CPU handle, in any build)
// It uses only the public C API, like any client; CLI11 parses its arguments (every command answers
// --help) and nlohmann-json writes bench's JSON.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fvattn/fvattn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_options.h"
#include "commands.h"
#include "demo_checks.h"
#include "reference64.h"
#include "soak_options.h"
#include "tensor_desc.h"

namespace {

using fvtool::rel_l2;

// ---- small helpers ----------------------------------------------------------------------------------

[[noreturn]] void die(const std::string& what, fva_status_t st) {
  fmt::print(stderr, "fvattn: {} failed: {}: {}\n", what, fva_status_string(st), fva_last_error());
  std::exit(2);
}

void check(fva_status_t st, const char* what) {
  if (st != FVA_OK) die(what, st);
}

const char* backend_name(int32_t b) {
  return b == FVA_BACKEND_CUDA ? "CUDA" : b == FVA_BACKEND_CPU ? "CPU" : "AUTO";
}

// A host buffer, 64-byte aligned (the API asks for 16).
struct Buffer {
  std::unique_ptr<unsigned char, decltype(&std::free)> mem{nullptr, &std::free};
  size_t bytes = 0;
  explicit Buffer(size_t n = 0) : bytes(n) {
    if (n) mem.reset(static_cast<unsigned char*>(std::aligned_alloc(64, (n + 63) / 64 * 64)));
  }
  void* get() const { return mem.get(); }
};

// A contiguous host tensor with its descriptor.
struct HostTensor {
  Buffer buf;
  fva_tensor_t desc{};
  HostTensor(int32_t dtype, const std::vector<int64_t>& shape)
      : buf(fvadesc::contiguous_bytes(dtype, shape)), desc(fvadesc::contiguous(buf.get(), dtype, shape)) {
    std::memset(buf.get(), 0xff, buf.bytes);  // poison: NaN for every float type
  }
  size_t numel() const {
    size_t n = 1;
    for (int i = 0; i < desc.rank; ++i) n *= static_cast<size_t>(desc.shape[i]);
    return n;
  }
};

uint16_t bf16_bits_of_representable(double x) {  // x already a bf16 value: truncation is exact
  const float f = static_cast<float>(x);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
double double_of_bf16_bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A bf16 attention tensor filled with N(0, 1) values, and the same values as a reference tensor.
struct Operand {
  HostTensor t;
  ref64::Tensor ref;
  Operand(ref64::Shape s, std::mt19937_64& rng, bool random = true)
      : t(FVA_DTYPE_BF16, {s.B, s.H, s.S, s.D}), ref(s) {
    std::normal_distribution<double> normal;
    auto* p = static_cast<uint16_t*>(t.buf.get());
    for (size_t i = 0; i < ref.data.size(); ++i) {
      if (!random) continue;
      ref.data[i] = ref64::round_bf16(normal(rng));
      p[i] = bf16_bits_of_representable(ref.data[i]);
    }
  }
  std::vector<double> values() const {
    const auto* p = static_cast<const uint16_t*>(t.buf.get());
    std::vector<double> v(t.numel());
    for (size_t i = 0; i < v.size(); ++i) v[i] = double_of_bf16_bits(p[i]);
    return v;
  }
};

std::vector<double> f32_values(const HostTensor& t) {
  const auto* p = static_cast<const float*>(t.buf.get());
  return std::vector<double>(p, p + t.numel());
}

// Median wall time of `runs` calls of fn, in milliseconds.
double time_ms(int runs, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Row {
  std::string op;
  double ms;
  double gflop;  // algorithmic FLOPs of the op (ARCHITECTURE.md conventions)
  std::vector<std::pair<std::string, double>> errors;
  double tolerance_for(const std::string& name) const { return name == "lse" ? 1e-3 : 1e-2; }
  bool pass() const {
    for (auto& [name, e] : errors)
      if (!(e <= tolerance_for(name))) return false;
    return true;
  }
};

// ---- info ---------------------------------------------------------------------------------------------

// What runs on the GPU, by operation, in the table `fvattn info` prints. The tool sees only the
// public API, so it derives this from fva_get_info's image and kernels fields with the library's own
// rules (kept in step with them by hand): src/cuda/sm90_kernels.cpp's sm90_available (image sm_90a,
// FVA_KERNELS_AUTO, D 64 or 128: every head dim the CUDA backend takes) and sm90_covers_p_scale (P
// unquantized or in block scales), as the planners src/cuda/qat_plan.cpp and vsa_plan.cpp apply them.
struct KernelRow {
  const char* op;
  std::string cuda;  // the kernel(s) on this handle's device
};

std::vector<KernelRow> cuda_kernels(const fva_handle_info_t& info) {
  const bool native = std::strcmp(info.image, "sm_90a") == 0 && info.kernels == FVA_KERNELS_AUTO;
  const std::string ds =
      info.ds_budget_mib > 0
          ? fmt::format("dQ from stored dS within ds_budget_mib ({} MiB), beyond it {}", info.ds_budget_mib,
                        info.deterministic ? "the dQ kernel" : "dQ fused into dK/dV (D = 128) or the dQ kernel")
          : std::string(info.deterministic ? "dQ kernel (ds_budget_mib 0)"
                                           : "dQ fused into dK/dV at D = 128, else the dQ kernel "
                                             "(ds_budget_mib 0)");
  std::vector<KernelRow> rows;
  if (native) {
    rows = {
        {"qat_forward",
         "sm90: TMA + wgmma, warp-specialized (P unquantized or in block scales, FastVideo's "
         "preset); P in tile/row scales: portable mma.sync"},
        {"qat_backward",
         "prep Delta + sm90 dK/dV (wgmma), " + ds + "; P in tile/row scales: portable dK/dV"},
        {"vsa_forward", "sm90: TMA + wgmma, warp-specialized, 64-row q blocks"},
        {"vsa_backward", "k2q inverse + sm90 dK/dV per kv block (wgmma), " + ds},
    };
  } else {
    rows = {
        {"qat_forward", "portable: mma.sync, 64-row blocks (4 warps x 16), 64-key tiles"},
        {"qat_backward", "portable: prep Delta + dQ per 64 rows, dK/dV per 64 keys (mma.sync)"},
        {"vsa_forward", "portable: mma.sync, 64-row q blocks (2 warps x 32)"},
        {"vsa_backward", "portable: k2q inverse, dQ per q block, dK/dV per kv block (mma.sync)"},
    };
  }
  rows.push_back({"vsa_layer",
                  "block means, coarse attention + top-k, gate (kernels/vsa_layer); fine branch: "
                  "the vsa_forward/vsa_backward rows"});
  rows.push_back({"vsa_invert_indices", "portable: count, scan, scatter, sort, emit"});
  rows.push_back({"nvfp4_fake_quantize", "prep: one warp per token tile"});
  return rows;
}

// The reason inside the library's "FVA_BACKEND_CUDA requested but no usable CUDA device: <why>":
// the tools probe for a GPU on their own account, the user asked for no backend.
std::string no_gpu_reason(std::string e) {
  const std::string marker = "no usable CUDA device: ";
  const size_t at = e.find(marker);
  if (at != std::string::npos) e = e.substr(at + marker.size());
  return e.empty() ? std::string("no CUDA driver or device") : e;
}

// A CUDA handle on the default device, or nullptr and why there is none.
fva_handle_t probe_gpu(std::string* why) {
  fva_handle_t h = nullptr;
  fva_handle_options_t opts = FVA_HANDLE_OPTIONS_INIT;
  opts.backend = FVA_BACKEND_CUDA;
  if (fva_create(&h, &opts) == FVA_OK) return h;
  *why = no_gpu_reason(fva_last_error());
  return nullptr;
}

// A handle's options as fva_create resolved them (FVA_OPTION_AUTO fields from their environment
// defaults, read once at create).
void print_options(const fva_handle_info_t& info) {
  const std::string split = info.qat_forward_split == FVA_OPTION_AUTO
                                ? std::string("auto (planned per call)")
                                : info.qat_forward_split == 0 ? std::string("never")
                                                              : fmt::format("{} pieces", info.qat_forward_split);
  fmt::print("  options: deterministic {}, kernels {}, qat_forward_split {}, qat_forward_clusters {}, "
             "ds_budget_mib {}, chained_launches {}, cpu_threads {}, ptx_jit {}\n",
             info.deterministic, info.kernels == FVA_KERNELS_PORTABLE ? "portable" : "auto", split,
             info.qat_forward_clusters ? "on where they apply" : "off", info.ds_budget_mib,
             info.chained_launches ? "on" : "off", info.cpu_threads, info.ptx_jit);
}

int cmd_info() {
  fmt::print("fvattn {}.{}.{} (library {}, ABI {}; header ABI {})\n", FVA_VERSION_MAJOR,
             FVA_VERSION_MINOR, FVA_VERSION_PATCH, fva_version(), fva_abi_version(), FVA_ABI_VERSION);
  std::string why;
  fva_handle_t h = probe_gpu(&why);
  fva_handle_info_t gpu{};
  bool have_gpu = false;
  if (h != nullptr) {
    gpu.struct_size = sizeof gpu;
    check(fva_get_info(h, &gpu), "fva_get_info");
    fva_destroy(h);
    fmt::print("CUDA device {}: {} (sm_{}{}, {} SMs)\n", gpu.device, gpu.device_name, gpu.sm_major,
               gpu.sm_minor, gpu.sm_count);
    const bool none = std::strcmp(gpu.image, "none") == 0;
    const bool native = std::strcmp(gpu.image, "sm_90a") == 0 && gpu.kernels == FVA_KERNELS_AUTO;
    fmt::print("CUDA kernel image: {}{}\n  why: {}\n", gpu.image,
               none ? " (this build has no image for this device: CUDA handles return "
                      "FVA_ERR_UNSUPPORTED; rebuild with its architecture in FVATTN_SASS_ARCHS)"
               : native ? " (Hopper-native kernels where they apply, portable mma.sync elsewhere)"
                        : " (portable mma.sync kernels: QAT, VSA, NVFP4 prep, the VSA layer)",
               gpu.image_reason);
    print_options(gpu);
    have_gpu = !none;
  } else {
    fmt::print("GPU: no GPU found ({}); using the CPU backend\n", why);
  }
  check(fva_create(&h, nullptr), "fva_create(AUTO)");
  fva_handle_info_t info;
  info.struct_size = sizeof info;
  check(fva_get_info(h, &info), "fva_get_info");
  fmt::print("default backend (FVA_BACKEND_AUTO): {} ({})\n", backend_name(info.backend),
             info.device_name);
  fva_destroy(h);
  fva_handle_options_t opts = FVA_HANDLE_OPTIONS_INIT;
  opts.backend = FVA_BACKEND_CPU;
  check(fva_create(&h, &opts), "fva_create(CPU)");
  check(fva_get_info(h, &info), "fva_get_info");
  fmt::print("CPU reference backend: {} worker threads (the handle option cpu_threads; its default "
             "from FVATTN_NUM_THREADS)\n",
             info.sm_count);
  fva_destroy(h);
  fmt::print("\ndispatch table ({}):\n",
             have_gpu ? fmt::format("CUDA rows: what runs on {} with default handle options",
                                    gpu.device_name)
                      : std::string("CPU backend only: no usable GPU here"));
  fmt::print("  {:<22} {:<8} {:<12} {:<18} {}\n", "op", "backend", "dtype", "head dim", "kernel");
  const std::vector<KernelRow> cuda = cuda_kernels(gpu);
  for (const KernelRow& row : cuda) {
    const std::string op = row.op;
    const bool indices = op == "vsa_invert_indices", nvfp4 = op == "nvfp4_fake_quantize";
    const bool vsa = op.compare(0, 3, "vsa") == 0;
    const char* dtype = indices ? "int32" : "bf16, f16";
    fmt::print("  {:<22} {:<8} {:<12} {:<18} {}\n", op, "CPU", dtype,
               indices ? "-" : vsa ? "64, 128" : nvfp4 ? "multiple of 16" : "16,32,64,128,256",
               "reference (src/cpu)");
    if (have_gpu)
      fmt::print("  {:<22} {:<8} {:<12} {:<18} {}\n", "", "CUDA", dtype,
                 indices ? "-" : nvfp4 ? "multiple of 16" : "64, 128", row.cuda);
  }
  if (!have_gpu)
    fmt::print("(on a GPU, `fvattn info` adds the CUDA rows: on sm_90a (H100, H200) Hopper-native "
               "kernels (TMA, wgmma) for the QAT forward, the VSA forward and both backwards' dQ/dK/dV, "
               "portable mma.sync kernels elsewhere)\n");
  return 0;
}

// ---- demo ---------------------------------------------------------------------------------------------

struct DemoShape {
  int64_t B = 1, H = 2, S = 1024, D = 128;
};

Row demo_qat(fva_handle_t h, const DemoShape& s, std::mt19937_64& rng, bool backward,
             int runs, const char* name) {
  const ref64::Shape shape{s.B, s.H, s.S, s.D};
  Operand q(shape, rng), k(shape, rng), v(shape, rng), dout(shape, rng);
  Operand o(shape, rng, false), o_hp(shape, rng, false);
  HostTensor lse(FVA_DTYPE_F32, {s.B, s.H, s.S});
  const fva_qat_config_t cfg = FVA_QAT_CONFIG_INIT;  // FastVideo's production preset

  size_t fwd_bytes = 0;
  check(fva_qat_forward_workspace_size(h, &cfg, &q.t.desc, &k.t.desc, &v.t.desc, &fwd_bytes),
        "fva_qat_forward_workspace_size");
  Buffer ws(fwd_bytes);
  auto forward = [&] {
    check(fva_qat_forward(h, &cfg, &q.t.desc, &k.t.desc, &v.t.desc, &o.t.desc, &o_hp.t.desc,
                          &lse.desc, ws.get(), ws.bytes, nullptr),
          "fva_qat_forward");
  };
  ref64::QatConfig rc;  // the same preset, field by field
  const double flop_fwd = 4.0 * s.B * s.H * s.S * s.S * s.D;
  fmt::print(stderr, "  {}: running the library ...\n", name);
  Row row;
  row.op = name;
  if (!backward) {
    row.ms = time_ms(runs, forward);
    row.gflop = flop_fwd * 1e-9;
    fmt::print(stderr, "  {}: running the float64 reference ...\n", name);
    const ref64::QatForward ref = ref64::qat_forward(rc, ref64::DType::BF16, q.ref, k.ref, v.ref);
    row.errors = {{"o", rel_l2(o.values(), ref.o.data)},
                  {"o_hp", rel_l2(o_hp.values(), ref.o_hp.data)},
                  {"lse", rel_l2(f32_values(lse), ref.lse)}};
    return row;
  }
  forward();
  Operand dq(shape, rng, false), dk(shape, rng, false), dv(shape, rng, false);
  size_t bwd_bytes = 0;
  check(fva_qat_backward_workspace_size(h, &cfg, &q.t.desc, &k.t.desc, &v.t.desc, &bwd_bytes),
        "fva_qat_backward_workspace_size");
  Buffer wsb(bwd_bytes);
  row.ms = time_ms(runs, [&] {
    check(fva_qat_backward(h, &cfg, &q.t.desc, &k.t.desc, &v.t.desc, &o_hp.t.desc, &lse.desc,
                           &dout.t.desc, &dq.t.desc, &dk.t.desc, &dv.t.desc, wsb.get(), wsb.bytes,
                           nullptr),
          "fva_qat_backward");
  });
  row.gflop = 2.5 * flop_fwd * 1e-9;
  fmt::print(stderr, "  {}: running the float64 reference ...\n", name);
  // The reference backward gets the library's own forward outputs, as a training step would.
  ref64::Tensor o_hp_lib(shape);
  o_hp_lib.data = o_hp.values();
  const ref64::Grads g = ref64::qat_backward(rc, ref64::DType::BF16, q.ref, k.ref, v.ref, o_hp_lib,
                                             f32_values(lse), dout.ref);
  row.errors = {{"dq", rel_l2(dq.values(), g.dq.data)},
                {"dk", rel_l2(dk.values(), g.dk.data)},
                {"dv", rel_l2(dv.values(), g.dv.data)}};
  return row;
}

// Block-sparse metadata at ~25% density: each q block attends `topk` distinct kv blocks (ascending,
// as FastVideo lists them); the last kv block is ragged, as at the end of a video.
ref64::VsaIndex demo_index(const DemoShape& s, std::mt19937_64& rng, int64_t topk) {
  ref64::VsaIndex idx;
  const int64_t nq = s.S / 64, nkv = s.S / 64;
  idx.B = s.B;
  idx.H = s.H;
  idx.num_q_blocks = nq;
  idx.max_k = topk;
  std::vector<int32_t> all(static_cast<size_t>(nkv));
  for (int64_t i = 0; i < nkv; ++i) all[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  for (int64_t r = 0; r < s.B * s.H * nq; ++r) {
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int32_t> pick(all.begin(), all.begin() + topk);
    std::sort(pick.begin(), pick.end());
    idx.q2k_idx.insert(idx.q2k_idx.end(), pick.begin(), pick.end());
    idx.q2k_num.push_back(static_cast<int32_t>(topk));
  }
  idx.block_sizes.assign(static_cast<size_t>(nkv), 64);
  idx.block_sizes.back() = 40;
  return idx;
}

HostTensor i32_tensor(const std::vector<int32_t>& values, const std::vector<int64_t>& shape) {
  HostTensor t(FVA_DTYPE_I32, shape);
  std::memcpy(t.buf.get(), values.data(), values.size() * 4);
  return t;
}

Row demo_vsa(fva_handle_t h, const DemoShape& s, std::mt19937_64& rng, bool backward, int runs,
             const char* name) {
  const ref64::Shape shape{s.B, s.H, s.S, s.D};
  const int64_t nq = s.S / 64, topk = std::max<int64_t>(1, nq / 4);
  Operand q(shape, rng), k(shape, rng), v(shape, rng), dout(shape, rng), o(shape, rng, false);
  HostTensor lse(FVA_DTYPE_F32, {s.B, s.H, s.S});
  const ref64::VsaIndex idx = demo_index(s, rng, topk);
  HostTensor q2k_idx = i32_tensor(idx.q2k_idx, {s.B, s.H, nq, topk});
  HostTensor q2k_num = i32_tensor(idx.q2k_num, {s.B, s.H, nq});
  HostTensor sizes = i32_tensor(idx.block_sizes, {nq});
  const fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;
  size_t fwd_bytes = 0;
  check(fva_vsa_forward_workspace_size(h, &cfg, &q.t.desc, &k.t.desc, &v.t.desc, &q2k_idx.desc,
                                       &fwd_bytes),
        "fva_vsa_forward_workspace_size");
  Buffer ws(fwd_bytes);
  auto forward = [&] {
    check(fva_vsa_forward(h, &cfg, &q.t.desc, &k.t.desc, &v.t.desc, &q2k_idx.desc, &q2k_num.desc,
                          &sizes.desc, &o.t.desc, &lse.desc, ws.get(), ws.bytes, nullptr),
          "fva_vsa_forward");
  };
  // Selected blocks only: 4 * D * 64 * 64 per (q block, kv block) pair.
  const double flop_fwd = 4.0 * s.B * s.H * nq * topk * 64.0 * 64.0 * s.D;
  const ref64::VsaConfig rc;
  fmt::print(stderr, "  {}: running the library ...\n", name);
  Row row;
  row.op = name;
  if (!backward) {
    row.ms = time_ms(runs, forward);
    row.gflop = flop_fwd * 1e-9;
    fmt::print(stderr, "  {}: running the float64 reference ...\n", name);
    const ref64::VsaForward ref = ref64::vsa_forward(rc, ref64::DType::BF16, q.ref, k.ref, v.ref, idx);
    row.errors = {{"o", rel_l2(o.values(), ref.o.data)}, {"lse", rel_l2(f32_values(lse), ref.lse)}};
    return row;
  }
  forward();
  Operand dq(shape, rng, false), dk(shape, rng, false), dv(shape, rng, false);
  size_t bwd_bytes = 0;
  check(fva_vsa_backward_workspace_size(h, &cfg, &q.t.desc, &k.t.desc, &v.t.desc, &q2k_idx.desc,
                                        &bwd_bytes),
        "fva_vsa_backward_workspace_size");
  Buffer wsb(bwd_bytes);
  row.ms = time_ms(runs, [&] {
    check(fva_vsa_backward(h, &cfg, &q.t.desc, &k.t.desc, &v.t.desc, &o.t.desc, &lse.desc,
                           &dout.t.desc, &q2k_idx.desc, &q2k_num.desc, &sizes.desc, &dq.t.desc,
                           &dk.t.desc, &dv.t.desc, wsb.get(), wsb.bytes, nullptr),
          "fva_vsa_backward");
  });
  row.gflop = 2.5 * flop_fwd * 1e-9;
  fmt::print(stderr, "  {}: running the float64 reference ...\n", name);
  ref64::Tensor o_lib(shape);
  o_lib.data = o.values();
  const ref64::Grads g = ref64::vsa_backward(rc, ref64::DType::BF16, q.ref, k.ref, v.ref, o_lib,
                                             f32_values(lse), dout.ref, idx);
  row.errors = {{"dq", rel_l2(dq.values(), g.dq.data)},
                {"dk", rel_l2(dk.values(), g.dk.data)},
                {"dv", rel_l2(dv.values(), g.dv.data)}};
  return row;
}

// The whole VSA layer (with gate) at the demo's shape: a quarter of the kv blocks per q block, the
// last block 40 tokens (its padding slots zero, as FastVideo's tiling leaves them). Forward and
// backward are checked together against the float64 reference over the library's own selection.
Row demo_layer(fva_handle_t h, const DemoShape& s, std::mt19937_64& rng, int runs, const char* name) {
  const ref64::Shape shape{s.B, s.H, s.S, s.D};
  const int64_t nb = s.S / 64, topk = std::max<int64_t>(1, nb / 4);
  Operand q(shape, rng), k(shape, rng), v(shape, rng), gate(shape, rng), dout(shape, rng);
  Operand out(shape, rng, false), dq(shape, rng, false), dk(shape, rng, false), dv(shape, rng, false),
      dgate(shape, rng, false);
  std::vector<int32_t> sizes(static_cast<size_t>(nb), 64);
  sizes.back() = 40;
  for (Operand* x : {&q, &k, &v}) {  // the last block's padding slots hold zeros
    auto* p = static_cast<uint16_t*>(x->t.buf.get());
    for (int64_t bh = 0; bh < s.B * s.H; ++bh)
      for (int64_t t = s.S - 24; t < s.S; ++t)
        for (int64_t d = 0; d < s.D; ++d) {
          const size_t i = static_cast<size_t>((bh * s.S + t) * s.D + d);
          p[i] = 0;
          x->ref.data[i] = 0.0;
        }
  }
  HostTensor tsizes = i32_tensor(sizes, {nb});
  HostTensor idx(FVA_DTYPE_I32, {s.B, s.H, nb, topk}), num(FVA_DTYPE_I32, {s.B, s.H, nb});
  fva_vsa_layer_config_t cfg = FVA_VSA_LAYER_CONFIG_INIT;
  cfg.topk = static_cast<int32_t>(topk);
  size_t ws_bytes = 0, reserve_bytes = 0;
  check(fva_vsa_layer_sizes(h, &cfg, &q.t.desc, &k.t.desc, &v.t.desc, &ws_bytes, &reserve_bytes),
        "fva_vsa_layer_sizes");
  Buffer ws(ws_bytes), reserve(reserve_bytes);
  fmt::print(stderr, "  {}: running the library ...\n", name);
  Row row;
  row.op = name;
  row.ms = time_ms(runs, [&] {
    check(fva_vsa_layer_forward(h, &cfg, &q.t.desc, &k.t.desc, &v.t.desc, &gate.t.desc,
                                &tsizes.desc, &tsizes.desc, &out.t.desc, &idx.desc, &num.desc,
                                reserve.get(), reserve.bytes, ws.get(), ws.bytes, nullptr),
          "fva_vsa_layer_forward");
    check(fva_vsa_layer_backward(h, &cfg, &q.t.desc, &k.t.desc, &v.t.desc, &gate.t.desc,
                                 &tsizes.desc, &tsizes.desc, &dout.t.desc, reserve.get(),
                                 reserve.bytes, &dq.t.desc, &dk.t.desc, &dv.t.desc, &dgate.t.desc,
                                 ws.get(), ws.bytes, nullptr),
          "fva_vsa_layer_backward");
  });
  // The fine branch's FLOPs, forward and backward (3.5x the forward's).
  row.gflop = 3.5 * 4.0 * s.B * s.H * nb * topk * 64.0 * 64.0 * s.D * 1e-9;
  fmt::print(stderr, "  {}: running the float64 reference ...\n", name);
  const ref64::VsaLayerInputs in{q.ref, k.ref, v.ref, gate.ref, true, sizes, sizes};
  const auto i32 = [](const HostTensor& t) { return static_cast<const int32_t*>(t.buf.get()); };
  row.errors = fvtool::layer_reference_errors(
      in, dout.ref, topk, {i32(idx), i32(idx) + idx.numel()}, {i32(num), i32(num) + num.numel()},
      out.values(), dq.values(), dk.values(), dv.values(), dgate.values());
  return row;
}

struct DemoOptions {
  DemoShape s;
  uint64_t seed = std::random_device{}();
  int runs = 3;
  CLI::Option* seq = nullptr;    // set: --seq given
  CLI::Option* heads = nullptr;  // set: --heads given
};

void add_demo_options(CLI::App& cmd, DemoOptions& d) {
  d.seq = cmd.add_option("--seq", d.s.S, "sequence length, a multiple of 64 (GPU default 16384, CPU 1024)")
              ->check(CLI::PositiveNumber);
  d.heads = cmd.add_option("--heads", d.s.H, "heads (GPU default 8, CPU 2)")->check(CLI::PositiveNumber);
  cmd.add_option("--seed", d.seed, "random seed (default: fresh each run, printed)");
  cmd.add_option("--runs", d.runs, "timed runs per op")->check(CLI::PositiveNumber)->capture_default_str();
  cmd.footer("On the GPU when there is one (B=1, H=8, S=16384, D=128 by default), else on the CPU\n"
             "reference backend (B=1, H=2, S=1024, D=128). Exit status 1 if a check fails.");
}

int cmd_demo(DemoOptions& d) {
  DemoShape& s = d.s;
  const uint64_t seed = d.seed;
  const int runs = d.runs;
  const bool seq_set = d.seq->count() > 0, heads_set = d.heads->count() > 0;
  if (s.S % 64) {
    fmt::print(stderr, "fvattn demo: --seq {} is not a multiple of 64 (VSA's block size); try --seq {}\n",
               s.S, (s.S + 63) / 64 * 64);
    return 2;
  }

  // On the GPU when there is one with a kernel image (B=1, H=8, S=16384 by default), else on the
  // CPU reference backend at a smaller shape, saying why.
  std::string why;
  fva_handle_t h = probe_gpu(&why);
  if (h != nullptr) {
    fva_handle_info_t ci;
    ci.struct_size = sizeof ci;
    check(fva_get_info(h, &ci), "fva_get_info");
#if FVATTN_TOOLS_GPU
    if (std::strcmp(ci.image, "none") != 0) {
      const int rc = fvtool::demo_gpu(h, heads_set ? s.H : 8, seq_set ? s.S : 16384, seed, runs);
      fva_destroy(h);
      return rc;
    }
    why = fmt::format("GPU {} (sm_{}{}) found, but this build has no kernel image for it", ci.device_name,
                      ci.sm_major, ci.sm_minor);
#else
    (void)seq_set;
    (void)heads_set;
    why = fmt::format("GPU {} found, but this fvattn was built without CUDA (FVATTN_CUDA=OFF)",
                      ci.device_name);
#endif
    fva_destroy(h);
  } else {
    why = fmt::format("no GPU found ({})", why);
  }
  fva_handle_options_t opts = FVA_HANDLE_OPTIONS_INIT;
  opts.backend = FVA_BACKEND_CPU;
  check(fva_create(&h, &opts), "fva_create(CPU)");
  fva_handle_info_t info;
  info.struct_size = sizeof info;
  check(fva_get_info(h, &info), "fva_get_info");

  fmt::print("fvattn {}.{}.{} demo: B={} H={} S={} D={}, bf16, seed {}\n", FVA_VERSION_MAJOR,
             FVA_VERSION_MINOR, FVA_VERSION_PATCH, s.B, s.H, s.S, s.D, seed);
  fmt::print("backend: {}; using the CPU backend (reference, {} threads)\n", why, info.sm_count);
  fmt::print("QAT: FastVideo production preset (NVFP4 block scales, high-precision o); "
             "VSA: 25% of kv blocks per q block, last block 40 tokens; VSA layer: the whole\n"
             "video_sparse_attn with gate, top-k a quarter of the blocks\n");
  fmt::print(stderr, "fvattn demo: running (each op {} time(s), then the float64 reference)\n", runs);

  std::mt19937_64 rng(seed);
  std::vector<Row> rows;
  rows.push_back(demo_qat(h, s, rng, false, runs, "qat forward"));
  rows.push_back(demo_qat(h, s, rng, true, runs, "qat backward"));
  rows.push_back(demo_vsa(h, s, rng, false, runs, "vsa forward"));
  rows.push_back(demo_vsa(h, s, rng, true, runs, "vsa backward"));
  rows.push_back(demo_layer(h, s, rng, runs, "vsa layer f+b"));
  fva_destroy(h);

  fmt::print("\n{:<14} {:>10} {:>9}  {:<44} {}\n", "op", "time ms", "GFLOP/s",
             "rel. L2 error vs float64 (bound)", "check");
  bool all = true;
  for (const Row& r : rows) {
    std::string errs;
    for (auto& [name, e] : r.errors)
      errs += fmt::format("{}{} {:.1e}", errs.empty() ? "" : ", ", name, e);
    all = all && r.pass();
    fmt::print("{:<14} {:>10.1f} {:>9.2f}  {:<44} {}\n", r.op, r.ms, r.gflop / (r.ms * 1e-3),
               errs, r.pass() ? "PASS" : "FAIL");
  }
  fmt::print("\nbounds (SPEC.md section 4): 1e-2 for o/o_hp/dq/dk/dv, 1e-3 for lse; times are medians "
             "of {} run(s) on this machine's CPU; FLOPs by ARCHITECTURE.md's conventions "
             "(backward = 2.5x forward; VSA counts selected blocks)\n",
             runs);
  return all ? 0 : 1;
}

// Whether `fvattn <cmd>` can run on this machine's GPU: a device, a kernel image for it, and a
// build with CUDA; when not, it says which is missing on stderr. `what` says what the command does
// with the GPU, `advice` ends the no-GPU message.
bool gpu_can_run(const char* cmd, const char* what, const char* advice) {
  std::string why;
  fva_handle_t h = probe_gpu(&why);
  if (h == nullptr) {
    fmt::print(stderr, "fvattn {}: no GPU found ({}).\n{} {} and needs an NVIDIA GPU with its driver{}.\n",
               cmd, why, cmd, what, advice);
    return false;
  }
  fva_handle_info_t info{};
  info.struct_size = sizeof info;
  check(fva_get_info(h, &info), "fva_get_info");
  fva_destroy(h);
#if FVATTN_TOOLS_GPU
  if (std::strcmp(info.image, "none") == 0) {
    fmt::print(stderr,
               "fvattn {}: GPU {} (sm_{}{}) found, but this build has no kernel image for it; "
               "rebuild with its architecture in FVATTN_SASS_ARCHS.\n",
               cmd, info.device_name, info.sm_major, info.sm_minor);
    return false;
  }
  return true;
#else
  fmt::print(stderr,
             "fvattn {}: GPU {} found, but this fvattn was built without CUDA (FVATTN_CUDA=OFF); "
             "rebuild with -DFVATTN_CUDA=ON to run {}.\n",
             cmd, info.device_name, cmd);
  return false;
#endif
}

// `fvattn bench`: parsed here in every build (its --help works without CUDA); it runs only on a GPU.
int cmd_bench(fvtool::BenchOptions& o, const fvtool::BenchParse& p) {
  const std::string bad = fvtool::finish_bench_options(o, p);
  if (!bad.empty()) {
    fmt::print(stderr, "fvattn bench: {}\nRun 'fvattn bench --help' for its options.\n", bad);
    return 2;
  }
  if (!gpu_can_run("bench", "times the CUDA kernels",
                   "; run it on such a machine, or run 'fvattn demo' to check the library on the CPU "
                   "backend here"))
    return 1;
#if FVATTN_TOOLS_GPU
  return fvtool::cmd_bench(o);
#else
  return 1;  // gpu_can_run says no in a build without CUDA
#endif
}

// `fvattn soak`: on a GPU, or with --backend cpu on the CPU backend in any build.
int cmd_soak_on_gpu(const fvtool::SoakOptions& o) {
  if (o.backend == "cpu") return fvtool::cmd_soak(o);
  if (!gpu_can_run("soak", "runs the CUDA kernels", "")) return 1;
  return fvtool::cmd_soak(o);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fvattn: QAT and VSA video attention (libfvattn): what it runs on, a checked demo, "
               "GPU benchmarks and a soak",
               "fvattn"};
  app.require_subcommand(0, 1);
  app.footer("Run 'fvattn <command> --help' for a command's options.");
  CLI::App* info = app.add_subcommand(
      "info", "version, ABI, backends, the GPU (or why there is none), and what runs where");
  info->footer("Takes no options.");
  DemoOptions demo_opts;
  CLI::App* demo = app.add_subcommand(
      "demo", "QAT and VSA attention forward+backward, checked against the float64 reference, timed");
  add_demo_options(*demo, demo_opts);
  fvtool::BenchOptions bench_opts;
  fvtool::BenchParse bench_parse;
  CLI::App* bench = app.add_subcommand(
      "bench", "GPU TFLOPS of QAT and VSA forward/backward over shapes, PyTorch SDPA alongside");
  fvtool::add_bench_options(*bench, bench_opts, bench_parse);
  fvtool::SoakOptions soak_opts;
  CLI::App* soak = app.add_subcommand(
      "soak", "random calls of every op from several threads on one GPU handle, checked, for N minutes");
  fvtool::add_soak_options(*soak, soak_opts);
  CLI::App* version = app.add_subcommand("version", "print the library version (MAJOR.MINOR.PATCH)");
  version->footer("Takes no options.");

  if (argc < 2) {
    fmt::print(stderr, "fvattn: no command given.\n{}", app.help());
    return 2;
  }
  const std::string first = argv[1];
  if (first == "help") {
    fmt::print("{}", app.help());
    return 0;
  }
  const bool known =
      first == "info" || first == "demo" || first == "bench" || first == "soak" || first == "version";
  if (first.empty() || (first[0] != '-' && !known)) {
    fmt::print(stderr, "fvattn: unknown command '{}'; the commands are info, demo, bench, soak and version.\n"
               "Run 'fvattn --help' for what each does.\n", first);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);  // the help of the command given (CLI11 delegates to the subcommand)
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const std::vector<CLI::App*> given = app.get_subcommands();
    const std::string cmd = given.empty() ? std::string("fvattn") : "fvattn " + given[0]->get_name();
    fmt::print(stderr, "{}: {}\nRun '{} --help' for {}.\n", cmd, e.what(), cmd,
               given.empty() ? "the commands" : "its options");
    return 2;
  }
  if (info->parsed()) return cmd_info();
  if (demo->parsed()) return cmd_demo(demo_opts);
  if (bench->parsed()) return cmd_bench(bench_opts, bench_parse);
  if (soak->parsed()) return cmd_soak_on_gpu(soak_opts);
  if (version->parsed()) {
    const int32_t v = fva_version();
    fmt::print("{}.{}.{}\n", v / 10000, v / 100 % 100, v % 100);
    return 0;
  }
  fmt::print(stderr, "fvattn: no command given.\n{}", app.help());
  return 2;
}
