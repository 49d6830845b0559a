// The CUDA backend's fault paths, as fvattn.h defines them: a workspace too small
// (FVA_ERR_WORKSPACE_TOO_SMALL, outputs untouched), a stream of another CUDA context and a current
// context of the wrong kind (FVA_ERR_INVALID_ARGUMENT before any work), a handle used after
// fva_destroy on another thread (FVA_ERR_INVALID_ARGUMENT), and a device pointer freed before the
// call (the library cannot know: the fault surfaces at the caller's next synchronization and as
// FVA_ERR_CUDA from later calls, never as a crash in the library). The last test breaks its CUDA
// context for good, so CTest runs it in a process of its own (test_gpu_faults_freed_pointer) and
// the main entry leaves it out.
//
// Without a usable GPU the program prints why and exits 77 (CTest: skipped).
#include <cuda.h>
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "gpu/gpu_fixtures.h"

using namespace fvt;

namespace {

// The driver calls this test makes itself (a second context and its stream), bound with dlopen
// like the library binds its own, so the program loads and skips where there is no driver. The
// versioned names are the driver's ABI (cuda.h maps the plain names onto them).
struct Driver {
  CUresult (*ctx_create)(CUcontext*, unsigned, CUdevice) = nullptr;  // cuCtxCreate_v2
  CUresult (*ctx_destroy)(CUcontext) = nullptr;                     // cuCtxDestroy_v2
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*ctx_get_device)(CUdevice*) = nullptr;
  CUresult (*stream_create)(CUstream*, unsigned) = nullptr;
  CUresult (*stream_destroy)(CUstream) = nullptr;  // cuStreamDestroy_v2
  CUresult (*stream_synchronize)(CUstream) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
};

const Driver& driver() {
  static const Driver d = [] {
    Driver x;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    REQUIRE_MESSAGE(lib != nullptr, "libcuda.so.1: " << dlerror());
    auto bind = [lib](auto*& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      REQUIRE_MESSAGE(reinterpret_cast<void*>(fn) != nullptr, "libcuda.so.1 lacks " << name);
    };
    bind(x.ctx_create, "cuCtxCreate_v2");
    bind(x.ctx_destroy, "cuCtxDestroy_v2");
    bind(x.ctx_get_current, "cuCtxGetCurrent");
    bind(x.ctx_set_current, "cuCtxSetCurrent");
    bind(x.ctx_get_device, "cuCtxGetDevice");
    bind(x.stream_create, "cuStreamCreate");
    bind(x.stream_destroy, "cuStreamDestroy_v2");
    bind(x.stream_synchronize, "cuStreamSynchronize");
    bind(x.get_error_string, "cuGetErrorString");
    return x;
  }();
  return d;
}

#define CU_OK(call)                                                                   \
  do {                                                                                \
    const CUresult r_ = (call);                                                       \
    const char* s_ = nullptr;                                                         \
    driver().get_error_string(r_, &s_);                                               \
    REQUIRE_MESSAGE(r_ == CUDA_SUCCESS, #call << " -> " << (s_ ? s_ : "?"));          \
  } while (0)

bool message_has(const char* what) { return std::string(fva_last_error()).find(what) != std::string::npos; }

// A small plain QAT forward problem: inputs on the device, outputs poisoned (0xFF), on the device.
struct QatProblem {
  fva_qat_config_t cfg = FVA_QAT_CONFIG_INIT;
  HostTensor q{FVA_DTYPE_BF16, {1, 2, 128, 64}}, k{FVA_DTYPE_BF16, {1, 2, 128, 64}},
      v{FVA_DTYPE_BF16, {1, 2, 128, 64}}, o{FVA_DTYPE_BF16, {1, 2, 128, 64}},
      lse{FVA_DTYPE_F32, {1, 2, 128}};
  QatProblem() {
    cfg.quantize = 0;
    cfg.high_precision_o = 0;
    std::vector<double> x(static_cast<size_t>(q.numel()));
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01 * static_cast<double>(i % 97) - 0.4;
    q.fill(x);
    k.fill(x);
    v.fill(x);
  }
};

struct DeviceQat {
  DeviceTensor q, k, v, o, lse;
  explicit DeviceQat(const QatProblem& p) : q(p.q), k(p.k), v(p.v), o(p.o), lse(p.lse) {}
  // True when o and lse still hold their poison (every byte 0xFF).
  bool outputs_untouched(const QatProblem& p) {
    HostTensor o_back(p.o.dtype(), p.o.shape()), lse_back(p.lse.dtype(), p.lse.shape());
    o.download(o_back);
    lse.download(lse_back);
    for (uint16_t b : o_back.bits16())
      if (b != 0xFFFF) return false;
    for (double x : lse_back.values())
      if (!std::isnan(x)) return false;
    return true;
  }
};

size_t qat_workspace(fva_handle_t h, const QatProblem& p, const DeviceQat& d) {
  size_t bytes = 0;
  REQUIRE_OK(fva_qat_forward_workspace_size(h, &p.cfg, d.q.t(), d.k.t(), d.v.t(), &bytes));
  return bytes;
}

}  // namespace

TEST_CASE("a workspace too small is refused with FVA_ERR_WORKSPACE_TOO_SMALL, outputs untouched") {
  CudaHandle h;
  SUBCASE("VSA backward (its workspace holds the inverted lists)") {
    const int64_t nq = 2, nkv = 2;
    HostTensor q(FVA_DTYPE_BF16, {1, 1, 64 * nq, 64}), k(FVA_DTYPE_BF16, {1, 1, 64 * nkv, 64}),
        dq(FVA_DTYPE_BF16, {1, 1, 64 * nq, 64}), lse(FVA_DTYPE_F32, {1, 1, 64 * nq}),
        idx(FVA_DTYPE_I32, {1, 1, nq, nkv}), num(FVA_DTYPE_I32, {1, 1, nq}), sizes(FVA_DTYPE_I32, {nkv});
    q.fill(std::vector<double>(static_cast<size_t>(q.numel()), 0.5));
    k.fill(std::vector<double>(static_cast<size_t>(k.numel()), 0.25));
    lse.fill(std::vector<double>(static_cast<size_t>(lse.numel()), 1.0));
    idx.fill_i32({0, 1, 1, 0});
    num.fill_i32({2, 2});
    sizes.fill_i32({64, 64});
    DeviceTensor dq_(q), dk_(k), dv_(k), dO(q), dlse(lse), ddout(q), didx(idx), dnum(num), dsizes(sizes);
    DeviceTensor gq(dq), gk(k), gv(k);
    HostTensor poison_q(FVA_DTYPE_BF16, {1, 1, 64 * nq, 64}), poison_k(FVA_DTYPE_BF16, {1, 1, 64 * nkv, 64});
    gq.upload(poison_q);
    gk.upload(poison_k);
    gv.upload(poison_k);
    fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;
    size_t need = 0;
    REQUIRE_OK(fva_vsa_backward_workspace_size(h.h, &cfg, dq_.t(), dk_.t(), dv_.t(), didx.t(), &need));
    REQUIRE(need > 0);
    for (const size_t given : {need - 1, need / 2, size_t{0}}) {
      CAPTURE(given);
      DeviceBuffer ws(need);
      const fva_status_t st = fva_vsa_backward(h.h, &cfg, dq_.t(), dk_.t(), dv_.t(), dO.t(), dlse.t(), ddout.t(),
                                               didx.t(), dnum.t(), dsizes.t(), gq.t(), gk.t(), gv.t(),
                                               ws.data(), given, nullptr);
      CHECK(st == FVA_ERR_WORKSPACE_TOO_SMALL);
      CHECK(message_has("ws_bytes"));
      HostTensor back_q(FVA_DTYPE_BF16, {1, 1, 64 * nq, 64}), back_k(FVA_DTYPE_BF16, {1, 1, 64 * nkv, 64});
      gq.download(back_q);
      gk.download(back_k);
      CHECK(back_q.bits16() == poison_q.bits16());
      CHECK(back_k.bits16() == poison_k.bits16());
    }
  }
  SUBCASE("QAT forward, where it needs a workspace") {
    QatProblem p;
    DeviceQat d(p);
    const size_t need = qat_workspace(h.h, p, d);
    if (need == 0) {
      MESSAGE("the QAT forward needs no workspace at this shape on this device: nothing to shorten");
      return;
    }
    DeviceBuffer ws(need);
    CHECK(fva_qat_forward(h.h, &p.cfg, d.q.t(), d.k.t(), d.v.t(), d.o.t(), nullptr, d.lse.t(), ws.data(),
                          need - 1, nullptr) == FVA_ERR_WORKSPACE_TOO_SMALL);
    CHECK(d.outputs_untouched(p));
  }
}

TEST_CASE("a stream of another CUDA context is refused before any work") {
  CudaHandle h;
  QatProblem p;
  DeviceQat d(p);
  const size_t need = qat_workspace(h.h, p, d);
  DeviceBuffer ws(need);

  const Driver& cu = driver();
  CUcontext primary = nullptr;
  CU_OK(cu.ctx_get_current(&primary));
  REQUIRE(primary != nullptr);
  CUdevice dev = 0;
  CU_OK(cu.ctx_get_device(&dev));
  CUcontext other = nullptr;
  CU_OK(cu.ctx_create(&other, 0, dev));  // current on this thread now
  CUstream other_stream = nullptr;
  CU_OK(cu.stream_create(&other_stream, CU_STREAM_NON_BLOCKING));
  CU_OK(cu.ctx_set_current(primary));
  CUstream primary_stream = nullptr;
  CU_OK(cu.stream_create(&primary_stream, CU_STREAM_NON_BLOCKING));

  SUBCASE("the stream is another context's") {
    const fva_status_t st = fva_qat_forward(h.h, &p.cfg, d.q.t(), d.k.t(), d.v.t(), d.o.t(), nullptr, d.lse.t(),
                                            ws.data(), need, other_stream);
    CHECK(st == FVA_ERR_INVALID_ARGUMENT);
    CHECK(message_has("stream:"));
    CHECK(d.outputs_untouched(p));
  }
  SUBCASE("the calling thread's current context is another one than the stream's") {
    CU_OK(cu.ctx_set_current(other));
    const fva_status_t st = fva_qat_forward(h.h, &p.cfg, d.q.t(), d.k.t(), d.v.t(), d.o.t(), nullptr, d.lse.t(),
                                            ws.data(), need, primary_stream);
    CU_OK(cu.ctx_set_current(primary));
    CHECK(st == FVA_ERR_INVALID_ARGUMENT);
    CHECK(message_has("stream:"));
    CHECK(d.outputs_untouched(p));
  }
  SUBCASE("a stream of the current context runs") {
    CHECK(fva_qat_forward(h.h, &p.cfg, d.q.t(), d.k.t(), d.v.t(), d.o.t(), nullptr, d.lse.t(), ws.data(), need,
                          primary_stream) == FVA_OK);
    CU_OK(cu.stream_synchronize(primary_stream));
    CHECK(!d.outputs_untouched(p));
  }
  CU_OK(cu.stream_destroy(primary_stream));
  CU_OK(cu.ctx_set_current(other));
  CU_OK(cu.stream_destroy(other_stream));
  CU_OK(cu.ctx_set_current(primary));
  CU_OK(cu.ctx_destroy(other));
  CU_OK(cu.ctx_set_current(primary));
}

TEST_CASE("a CUDA handle destroyed on another thread is refused, outputs untouched") {
  QatProblem p;
  DeviceQat d(p);
  fva_handle_options_t o = test_handle_options();
  fva_handle_t h = nullptr;
  REQUIRE_OK(fva_create(&h, &o));
  const size_t need = qat_workspace(h, p, d);
  DeviceBuffer ws(need);
  std::thread([h] { CHECK(fva_destroy(h) == FVA_OK); }).join();
  CHECK(fva_qat_forward(h, &p.cfg, d.q.t(), d.k.t(), d.v.t(), d.o.t(), nullptr, d.lse.t(), ws.data(), need,
                        nullptr) == FVA_ERR_INVALID_ARGUMENT);
  CHECK(message_has("not a live handle"));
  CHECK(d.outputs_untouched(p));
  CHECK(fva_destroy(h) == FVA_ERR_INVALID_ARGUMENT);
}

// Run alone (CTest: test_gpu_faults_freed_pointer): the fault it provokes is sticky, every later
// CUDA call of the process fails.
TEST_CASE("freed device pointer: the fault surfaces at the next sync and as FVA_ERR_CUDA, no crash") {
  CudaHandle h;
  QatProblem p;
  DeviceQat d(p);
  const size_t need = qat_workspace(h.h, p, d);
  DeviceBuffer ws(need);
  // q in a large allocation, freed before the call: its pages are unmapped, so the kernel's loads
  // fault (a small one might sit in a pool the driver keeps mapped).
  const size_t big = size_t{256} << 20;
  void* mem = cuda::alloc(big);
  cuda::copy_to_device(mem, p.q.data(), p.q.bytes());
  fva_tensor_t q = p.q.desc();
  q.data = mem;
  cuda::release(mem);
  const fva_status_t st = fva_qat_forward(h.h, &p.cfg, &q, d.k.t(), d.v.t(), d.o.t(), nullptr, d.lse.t(),
                                          ws.data(), need, nullptr);
  MESSAGE("the call with a freed q returned " << fva_status_string(st));
  CHECK((st == FVA_OK || st == FVA_ERR_CUDA));  // the library cannot know; it launched, or saw an error
  const cudaError_t sync = cudaDeviceSynchronize();
  MESSAGE("the next synchronization returned " << cudaGetErrorString(sync));
  if (sync == cudaSuccess) {
    MESSAGE("the freed pages were still mapped: no fault to observe on this driver");
    return;
  }
  // The context is broken: later calls report it as a status.
  const fva_status_t next = fva_qat_forward(h.h, &p.cfg, d.q.t(), d.k.t(), d.v.t(), d.o.t(), nullptr, d.lse.t(),
                                            ws.data(), need, nullptr);
  MESSAGE("the next fvattn call returned " << fva_status_string(next) << ": " << fva_last_error());
  CHECK(next == FVA_ERR_CUDA);
  CHECK(std::string(fva_last_error()).size() > 0);
}
